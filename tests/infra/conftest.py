"""Infra test helpers: synthesize the real app (with cdk-nag) in-process, cached per context.

A synth costs several seconds, so each distinct context is synthesized once per test run and
shared. The context is what the CLI would pass: cdk.json's context (feature flags and the
documented defaults), cdk.context.json's AZ facts, path metadata on, plus the overrides,
given as strings exactly like `-c name=value`.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App
from aws_cdk.assertions import Template

from stacks.application import build
from stacks.config import LeaseworkerConfig, load_config
from stacks.leaseworker_stack import LeaseworkerStack

REPO = Path(__file__).resolve().parents[2]
ASSET_HASH = re.compile(r"[0-9a-f]{64}")

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION", "1")


def base_context() -> dict[str, Any]:
    context: dict[str, Any] = json.loads((REPO / "cdk.json").read_text())["context"]
    context.update(json.loads((REPO / "cdk.context.json").read_text()))
    # What the CLI passes by default: the construct path on every resource (cfn-lint
    # recognises CDK output by it) and asset metadata.
    context["aws:cdk:enable-path-metadata"] = True
    context["aws:cdk:enable-asset-metadata"] = True
    return context


@dataclass(frozen=True)
class Synth:
    config: LeaseworkerConfig
    stack: LeaseworkerStack
    template_json: dict[str, Any]
    outdir: Path

    @property
    def template(self) -> Template:
        return Template.from_json(self.template_json)

    def resources(self, resource_type: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.template_json["Resources"].items() if v["Type"] == resource_type}

    def one(self, resource_type: str) -> dict[str, Any]:
        found = self.resources(resource_type)
        assert len(found) == 1, f"expected one {resource_type}, found {sorted(found)}"
        return next(iter(found.values()))


def make_app(overrides: Mapping[str, Any] | None = None) -> tuple[App, LeaseworkerStack, Path]:
    """An app built exactly as app.py builds it (context -> config -> build)."""
    outdir = Path(tempfile.mkdtemp(prefix="leaseworker-synth-"))
    atexit.register(shutil.rmtree, outdir, ignore_errors=True)
    app = App(context={**base_context(), **(overrides or {})}, outdir=str(outdir))
    stack = build(app, load_config(app.node.try_get_context, app.node.get_all_context()))
    return app, stack, outdir


_CACHE: dict[str, Synth] = {}


def synth(overrides: Mapping[str, Any] | None = None) -> Synth:
    key = json.dumps(overrides or {}, sort_keys=True)
    if key not in _CACHE:
        app, stack, outdir = make_app(overrides)
        assembly = app.synth()
        template = assembly.get_stack_artifact(stack.artifact_id).template
        _CACHE[key] = Synth(
            config=load_config(app.node.try_get_context),
            stack=stack,
            template_json=template,
            outdir=outdir,
        )
    return _CACHE[key]


def normalise(template: Mapping[str, Any]) -> Any:
    """The template with asset hashes replaced (they change with every worker_src edit)."""
    return json.loads(ASSET_HASH.sub("<asset-hash>", json.dumps(template, sort_keys=True)))


def container_environment(template_json: Mapping[str, Any], container: str = "worker") -> dict[str, Any]:
    (task_definition,) = [
        r for r in template_json["Resources"].values() if r["Type"] == "AWS::ECS::TaskDefinition"
    ]
    (definition,) = [
        c for c in task_definition["Properties"]["ContainerDefinitions"] if c["Name"] == container
    ]
    return {e["Name"]: e["Value"] for e in definition.get("Environment", [])}


# Every parameter set to a non-default value, as `-c` strings. A separate account needs its
# own AZ facts (offline synth never looks them up). leaseMode's other value is the seed-faithful
# connection mode, within its index ceiling (6 x 400 <= 500 x 8).
CUSTOM_ACCOUNT = "210987654321"
CUSTOM: dict[str, Any] = {
    "stage": "prod",
    "account": CUSTOM_ACCOUNT,
    "region": "eu-west-1",
    "leaseMode": "connection",
    "leaseSeconds": "40",
    "heartbeatSeconds": "8",
    "reconcileSeconds": "7",
    "checkpointSeconds": "9",
    "maxClockSkewMs": "2000",
    "maxConnectionsPerTask": "500",
    "stopTimeoutSeconds": "90",
    "metricsSeconds": "15",
    "sink": "null",
    "minTasks": "2",
    # Its effect is tested in test_production.py (prod with minTasks=1); here it must only parse.
    "allowSingleTaskProd": "true",
    # No effect with sink=null: test_production.py tests it on a prod stack with a stream.
    "kinesisRetentionHours": "72",
    "kinesisShards": "2",
    "cpuArchitecture": "arm64",
    "collectorImage": (
        "123456789012.dkr.ecr.eu-west-1.amazonaws.com/ecr-public/aws-observability/aws-otel-collector"
        "@sha256:d2bdfff2c377c3d71d78bd5d9ce9862fd535b12134a5739d87a07801297cf9fd"
    ),
    "maxTasks": "6",
    "taskCpu": "1024",
    "taskMemoryMiB": "3072",
    "natGateways": "2",
    "scaleTargetConnections": "400",
    "scaleInCooldownSeconds": "600",
    "scaleOutCooldownSeconds": "30",
    "alarmEmail": "ops@example.com",
    "metricsNamespace": "Custom/Leaseworker",
    "traceSampleRatio": "0.5",
    # A name (its ARN takes the stack's account and region) and a full ARN, as `-c a,b` passes them.
    "upstreamSecrets": (
        "feeds/alpaca,arn:aws:secretsmanager:eu-west-1:210987654321:secret:feeds/binance-AbC123"
    ),
    f"availability-zones:account={CUSTOM_ACCOUNT}:region=eu-west-1": ["eu-west-1a", "eu-west-1b"],
}


@pytest.fixture(scope="session")
def default() -> Synth:
    return synth()


@pytest.fixture(scope="session")
def custom() -> Synth:
    return synth(CUSTOM)


@pytest.fixture
def tmp_outdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="leaseworker-test-") as directory:
        yield Path(directory)
