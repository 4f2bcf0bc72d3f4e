"""Each context parameter reaches the template; `-c leaseSeconds=30` changes exactly one value."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stacks.config import PARAMETERS
from tests.infra.conftest import (
    CUSTOM,
    Synth,
    container_environment,
    normalise,
    synth,
)

# Context parameters that the worker receives as environment variables: (context, env var).
ENV_PARAMETERS: dict[str, str] = {
    "leaseMode": "LEASE_MODE",
    "leaseSeconds": "LEASE_SECONDS",
    "heartbeatSeconds": "HEARTBEAT_SECONDS",
    "reconcileSeconds": "RECONCILE_SECONDS",
    "checkpointSeconds": "CHECKPOINT_SECONDS",
    "maxClockSkewMs": "MAX_CLOCK_SKEW_MS",
    "maxConnectionsPerTask": "MAX_CONNECTIONS",
    "stopTimeoutSeconds": "SHUTDOWN_GRACE_SECONDS",
    "metricsSeconds": "METRICS_SECONDS",
    "sink": "SINK",
    "metricsNamespace": "POWERTOOLS_METRICS_NAMESPACE",
    "traceSampleRatio": "OTEL_TRACES_SAMPLER_ARG",
}


def _props(synth: Synth, resource_type: str) -> dict[str, Any]:
    return synth.one(resource_type)["Properties"]  # type: ignore[no-any-return]


# Context parameters with an effect elsewhere in the template: how to read it back.
OTHER_EFFECTS: dict[str, Callable[[Synth], object]] = {
    "stage": lambda s: s.one("AWS::DynamoDB::Table")["DeletionPolicy"],
    "account": lambda s: s.stack.account,
    "region": lambda s: s.stack.region,
    "minTasks": lambda s: _props(s, "AWS::ApplicationAutoScaling::ScalableTarget")["MinCapacity"],
    "maxTasks": lambda s: _props(s, "AWS::ApplicationAutoScaling::ScalableTarget")["MaxCapacity"],
    "taskCpu": lambda s: _props(s, "AWS::ECS::TaskDefinition")["Cpu"],
    "taskMemoryMiB": lambda s: _props(s, "AWS::ECS::TaskDefinition")["Memory"],
    "natGateways": lambda s: len(s.resources("AWS::EC2::NatGateway")),
    "scaleTargetConnections": lambda s: _props(s, "AWS::ApplicationAutoScaling::ScalingPolicy")[
        "TargetTrackingScalingPolicyConfiguration"
    ]["TargetValue"],
    "scaleInCooldownSeconds": lambda s: _props(s, "AWS::ApplicationAutoScaling::ScalingPolicy")[
        "TargetTrackingScalingPolicyConfiguration"
    ]["ScaleInCooldown"],
    "scaleOutCooldownSeconds": lambda s: _props(s, "AWS::ApplicationAutoScaling::ScalingPolicy")[
        "TargetTrackingScalingPolicyConfiguration"
    ]["ScaleOutCooldown"],
    "alarmEmail": lambda s: [
        r["Properties"]["Endpoint"] for r in s.resources("AWS::SNS::Subscription").values()
    ],
    "upstreamSecrets": lambda s: sorted(
        resource
        for policy in s.resources("AWS::IAM::Policy").values()
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        if statement["Action"] == "secretsmanager:GetSecretValue"
        for resource in statement["Resource"]
    ),
}


def _container_image(synth: Synth, name: str) -> object:
    (definition,) = [
        c for c in _props(synth, "AWS::ECS::TaskDefinition")["ContainerDefinitions"] if c["Name"] == name
    ]
    return definition["Image"]


OTHER_EFFECTS["cpuArchitecture"] = lambda s: _props(s, "AWS::ECS::TaskDefinition")["RuntimePlatform"][
    "CpuArchitecture"
]
OTHER_EFFECTS["collectorImage"] = lambda s: _container_image(s, "otel-collector")

# Parameters whose effect the all-custom stack cannot show, each tested where it can be.
EFFECTS_TESTED_ELSEWHERE: dict[str, str] = {
    "kinesisRetentionHours": "test_production.py::test_prod_stream_is_retained_for_a_week",
    "allowSingleTaskProd": "test_production.py::test_prod_single_task_only_when_explicit",
    "kinesisShards": "test_production.py::test_kinesis_shards_make_a_provisioned_stream",
}

EXPECTED_CUSTOM_EFFECTS: dict[str, object] = {
    "cpuArchitecture": "ARM64",
    "collectorImage": CUSTOM["collectorImage"],
    "stage": "Retain",
    "account": CUSTOM["account"],
    "region": "eu-west-1",
    "minTasks": 2,
    "maxTasks": 6,
    "taskCpu": "1024",
    "taskMemoryMiB": "3072",
    "natGateways": 2,
    "scaleTargetConnections": 400,
    "scaleInCooldownSeconds": 600,
    "scaleOutCooldownSeconds": 30,
    "alarmEmail": ["ops@example.com"],
    "upstreamSecrets": [
        "arn:aws:secretsmanager:eu-west-1:210987654321:secret:feeds/alpaca-??????",
        "arn:aws:secretsmanager:eu-west-1:210987654321:secret:feeds/binance-AbC123",
    ],
}


def test_every_parameter_has_an_effect_test() -> None:
    covered = set(ENV_PARAMETERS) | set(OTHER_EFFECTS) | set(EFFECTS_TESTED_ELSEWHERE)
    assert covered == {p.context for p in PARAMETERS}
    assert set(EXPECTED_CUSTOM_EFFECTS) == set(OTHER_EFFECTS)
    assert set(CUSTOM) >= covered


@pytest.mark.parametrize(("context", "env_var"), sorted(ENV_PARAMETERS.items()))
def test_context_parameter_reaches_container_environment(
    default: Synth, custom: Synth, context: str, env_var: str
) -> None:
    if context not in CUSTOM:
        pytest.skip(f"{context} has no other value synth accepts yet (see test_config.py)")
    default_env = container_environment(default.template_json)
    custom_env = container_environment(custom.template_json)
    assert custom_env[env_var] == CUSTOM[context]
    assert custom_env[env_var] != default_env[env_var]


@pytest.mark.parametrize("context", sorted(OTHER_EFFECTS))
def test_context_parameter_changes_its_resource(default: Synth, custom: Synth, context: str) -> None:
    read = OTHER_EFFECTS[context]
    assert read(custom) == EXPECTED_CUSTOM_EFFECTS[context]
    assert read(default) != read(custom)


def test_default_container_environment(default: Synth) -> None:
    env = container_environment(default.template_json)
    table_id = next(iter(default.resources("AWS::DynamoDB::Table")))
    queue_id = next(
        k for k, r in default.resources("AWS::SQS::Queue").items() if "RedrivePolicy" in r["Properties"]
    )
    assert env == {
        "TABLE_NAME": {"Ref": table_id},
        "NOTIFY_QUEUE_URL": {"Ref": queue_id},
        "SINK": env["SINK"],  # asserted in test_resources (kinesis:<stream>)
        "LEASE_MODE": "session",
        "LEASE_SECONDS": "20",
        "HEARTBEAT_SECONDS": "5",
        "RECONCILE_SECONDS": "5",
        "CHECKPOINT_SECONDS": "5",
        "MAX_CLOCK_SKEW_MS": "1000",
        "MAX_CONNECTIONS": "1000",
        "SHUTDOWN_GRACE_SECONDS": "60",
        "METRICS_SECONDS": "30",
        "POWERTOOLS_SERVICE_NAME": "leaseworker",
        "POWERTOOLS_METRICS_NAMESPACE": "Leaseworker",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4318",
        "OTEL_SERVICE_NAME": "leaseworker",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.01",
    }


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """JSON paths at which two documents differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}/{i}")
        ]
    return [] if a == b else [path]


def test_lease_seconds_string_changes_only_lease_seconds(default: Synth) -> None:
    changed = synth({"leaseSeconds": "30"})
    assert changed.config.lease_seconds == 30
    before, after = normalise(default.template_json), normalise(changed.template_json)
    diff = differences(before, after)
    (task_definition_id,) = default.resources("AWS::ECS::TaskDefinition")
    definitions = before["Resources"][task_definition_id]["Properties"]["ContainerDefinitions"]
    worker_index = next(i for i, c in enumerate(definitions) if c["Name"] == "worker")
    env_index = next(
        i for i, e in enumerate(definitions[worker_index]["Environment"]) if e["Name"] == "LEASE_SECONDS"
    )
    worker = f"/Resources/{task_definition_id}/Properties/ContainerDefinitions/{worker_index}"
    # The lease also sets how long the health check tolerates failures (HealthCheckTiming).
    assert diff == [
        f"{worker}/Environment/{env_index}/Value",
        f"{worker}/HealthCheck/Retries",
        f"{worker}/HealthCheck/StartPeriod",
    ]
    assert container_environment(changed.template_json)["LEASE_SECONDS"] == "30"


SNAPSHOT = Path(__file__).parent / "snapshots" / "leaseworker-dev.json"


def test_snapshot(default: Synth) -> None:
    """Guards against unintended drift. Regenerate with UPDATE_SNAPSHOTS=1 and review the diff."""
    current = normalise(default.template_json)
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
    assert SNAPSHOT.exists(), "no snapshot yet: run with UPDATE_SNAPSHOTS=1"
    assert current == json.loads(SNAPSHOT.read_text()), "template drifted: review, then UPDATE_SNAPSHOTS=1"
