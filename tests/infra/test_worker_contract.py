"""What synth accepts, the worker accepts: the real worker `Settings` from synthesized templates.

For each edge value synth accepts, the worker container's environment is read out of the
synthesized task definition (resource references replaced by plausible values) and handed to
`leaseworker.settings.load_settings`, which must not raise and must read the same values.
"""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace import sampling

from leaseworker.settings import load_settings
from tests.infra.conftest import Synth, container_environment, synth

# Edge values synth accepts, combined into few synths (each costs seconds).
EDGES: dict[str, dict[str, str]] = {
    # The lowest lease for a heartbeat, the largest skew for that lease, the shortest stop
    # timeout, no tracing, stdout sink.
    "tight": {
        "leaseSeconds": "15",
        "heartbeatSeconds": "5",
        "maxClockSkewMs": "3749",
        "stopTimeoutSeconds": "2",
        "traceSampleRatio": "0",
        "sink": "stdout",
    },
    # prod without natGateways (one NAT per AZ), the longest stop timeout, one connection per
    # task, a fleet exactly at the connection-mode ceiling (500 x 1 = 500 x 1), every trace.
    "wide": {
        "stage": "prod",
        "heartbeatSeconds": "1",
        "leaseSeconds": "3",
        "maxClockSkewMs": "0",
        "stopTimeoutSeconds": "120",
        "maxConnectionsPerTask": "1",
        "scaleTargetConnections": "1",
        "maxTasks": "500",
        "traceSampleRatio": "1",
        "sink": "null",
        "metricsSeconds": "1",
    },
}

# Stand-ins for what CloudFormation resolves at deploy time.
RESOLVED = {
    "TABLE_NAME": "Leaseworker-dev-LeaseTable-ABC",
    "NOTIFY_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/Leaseworker-dev-Queue",
    "SINK": "kinesis:Leaseworker-dev-SinkStream-ABC",
}


def resolved_environment(synth: Synth) -> dict[str, str]:
    env: dict[str, Any] = container_environment(synth.template_json)
    return {k: v if isinstance(v, str) else RESOLVED[k] for k, v in env.items()}


@pytest.fixture(scope="module", params=["default", "custom", *EDGES])
def edge(request: pytest.FixtureRequest, default: Synth, custom: Synth) -> Synth:
    name: str = request.param
    if name == "default":
        return default
    if name == "custom":
        return custom
    return synth(EDGES[name])


def test_worker_settings_load_from_the_synthesized_environment(edge: Synth) -> None:
    env = resolved_environment(edge)
    settings = load_settings(env)
    config = edge.config
    assert settings.lease_mode == config.lease_mode
    assert settings.lease_seconds == config.lease_seconds
    assert settings.heartbeat_seconds == config.heartbeat_seconds
    assert settings.max_clock_skew_ms == config.max_clock_skew_ms
    assert settings.shutdown_grace_seconds == config.stop_timeout_seconds == worker_stop_timeout(edge)
    assert settings.max_connections == config.max_connections_per_task
    assert settings.otel_endpoint == "http://localhost:4318"


def test_opentelemetry_reads_the_synthesized_sampler(edge: Synth, monkeypatch: pytest.MonkeyPatch) -> None:
    env = resolved_environment(edge)
    for name in ("OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"):
        monkeypatch.setenv(name, env[name])
    sampler = sampling._get_from_env_or_default()
    assert isinstance(sampler, sampling.ParentBased)
    description: str = sampler.get_description()  # type: ignore[no-untyped-call]
    assert f"TraceIdRatioBased{{{edge.config.trace_sample_ratio}}}" in description


def worker_stop_timeout(synth: Synth) -> int:
    task_definition = synth.one("AWS::ECS::TaskDefinition")
    (worker,) = [c for c in task_definition["Properties"]["ContainerDefinitions"] if c["Name"] == "worker"]
    return int(worker["StopTimeout"])


def test_prod_without_nat_gateways_gets_one_per_az() -> None:
    wide = synth(EDGES["wide"])
    assert wide.config.nat_gateways is None
    assert len(wide.resources("AWS::EC2::NatGateway")) == 2
