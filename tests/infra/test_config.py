"""The context parser: defaults, strict parsing of `-c` strings, one-line errors per parameter."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stacks import config as config_module
from stacks.config import (
    PARAMETERS,
    VPC_MAX_AZS,
    ConfigError,
    LeaseworkerConfig,
    default_context,
    load_config,
)
from tests.infra.conftest import REPO


def parse(**context: Any) -> LeaseworkerConfig:
    return load_config(context.get)


def test_defaults_are_the_documented_ones() -> None:
    config = parse()
    assert config == LeaseworkerConfig()
    assert (config.lease_mode, config.lease_seconds, config.heartbeat_seconds) == ("session", 20, 5)
    assert (config.reconcile_seconds, config.checkpoint_seconds, config.max_clock_skew_ms) == (5, 5, 1000)
    assert (config.max_connections_per_task, config.stop_timeout_seconds, config.sink) == (
        1000,
        60,
        "kinesis",
    )
    assert (config.min_tasks, config.max_tasks, config.task_cpu, config.task_memory_mib) == (1, 10, 512, 1024)
    assert (config.cpu_architecture, config.stream_retention_hours, config.allow_single_task_prod) == (
        "x86_64",
        24,
        False,
    )
    assert "@sha256:" in config.collector_image
    assert (config.nat_gateway_count, config.alarm_email, config.metrics_namespace) == (
        1,
        None,
        "Leaseworker",
    )
    assert config.trace_sample_ratio == 0.01
    assert (config.stage, config.account, config.region) == ("dev", "123456789012", "us-east-1")
    assert config.scale_target_connections <= config.max_connections_per_task
    # Session mode has no index ceiling: the default fleet may exceed connection mode's.
    assert config.max_fleet_connections == 7000 > config.gsi_connection_ceiling == 2500


def test_prod_defaults_to_one_nat_gateway_per_az_and_natgateways_overrides() -> None:
    assert parse(stage="prod").nat_gateway_count == VPC_MAX_AZS == 2
    assert parse(stage="prod", natGateways="1").nat_gateway_count == 1
    assert parse(stage="dev").nat_gateway_count == 1
    assert parse(stage="dev", natGateways="2").nat_gateway_count == 2
    # cdk.json must not pin natGateways, or it would override the stage default.
    assert "natGateways" not in json.loads((REPO / "cdk.json").read_text())["context"]


def test_prod_defaults_to_two_tasks_and_a_week_of_kinesis_retention() -> None:
    prod = parse(stage="prod")
    assert (prod.min_tasks, prod.stream_retention_hours) == (2, 168)
    assert parse(stage="prod", kinesisRetentionHours="48").stream_retention_hours == 48
    assert parse(stage="prod", minTasks="4").min_tasks == 4
    # cdk.json must not pin a stage default, or it would override the stage's.
    context = json.loads((REPO / "cdk.json").read_text())["context"]
    assert not set(config_module.STAGE_DEFAULTS) & set(context)


def test_prod_with_one_task_is_refused_unless_explicit() -> None:
    message = (
        "invalid context minTasks=1: prod runs at least 2 tasks (one task orphans every connection "
        "while it is replaced); pass -c allowSingleTaskProd=true to run fewer on purpose"
    )
    with pytest.raises(ConfigError) as raised:
        parse(stage="prod", minTasks="1")
    assert str(raised.value) == message
    with pytest.raises(ConfigError):
        parse(stage="prod", minTasks="1", allowSingleTaskProd="false")
    assert parse(stage="prod", minTasks="1", allowSingleTaskProd="true").min_tasks == 1
    assert parse(stage="prod", minTasks="1", allowSingleTaskProd=True).min_tasks == 1
    assert parse(stage="dev", minTasks="1").min_tasks == 1


def test_cdk_json_repeats_exactly_the_config_defaults() -> None:
    context = json.loads((REPO / "cdk.json").read_text())["context"]
    documented = default_context()
    assert {k: context[k] for k in documented if k in context} == documented
    assert set(documented) <= set(context)
    assert context["cli-telemetry"] is False
    assert json.loads((REPO / "cdk.json").read_text())["notices"] is False


def test_cli_strings_and_json_numbers_parse_the_same() -> None:
    assert parse(leaseSeconds="30") == parse(leaseSeconds=30)
    assert parse(leaseSeconds=" 30 ").lease_seconds == 30
    assert parse(alarmEmail="") == parse()


def test_config_is_frozen() -> None:
    config = parse()
    with pytest.raises(AttributeError):
        config.lease_seconds = 1  # type: ignore[misc]


# (context name, bad value, expected one-line message). Every parameter appears at least once.
BAD: list[tuple[str, Any, str]] = [
    ("stage", "staging", "invalid context stage='staging': must be one of dev | prod"),
    ("account", "12345", "invalid context account='12345': must be a 12-digit AWS account id"),
    ("region", "mars", "invalid context region='mars': must be an AWS region like us-east-1"),
    ("leaseMode", "lock", "invalid context leaseMode='lock': must be one of connection | session"),
    ("traceSampleRatio", "nan", "invalid context traceSampleRatio='nan': must be a number between 0 and 1"),
    (
        "traceSampleRatio",
        float("nan"),
        "invalid context traceSampleRatio=nan: must be a number between 0 and 1",
    ),
    ("traceSampleRatio", "inf", "invalid context traceSampleRatio='inf': must be a number between 0 and 1"),
    ("traceSampleRatio", "1.5", "invalid context traceSampleRatio='1.5': must be a number between 0 and 1"),
    ("traceSampleRatio", "-0.1", "invalid context traceSampleRatio='-0.1': must be a number between 0 and 1"),
    ("traceSampleRatio", True, "invalid context traceSampleRatio=True: must be a number between 0 and 1"),
    ("traceSampleRatio", "0,5", "invalid context traceSampleRatio='0,5': must be a number between 0 and 1"),
    ("leaseSeconds", "abc", "invalid context leaseSeconds='abc': must be an integer"),
    ("leaseSeconds", "20.5", "invalid context leaseSeconds='20.5': must be an integer"),
    ("leaseSeconds", True, "invalid context leaseSeconds=True: must be an integer"),
    ("leaseSeconds", "14", "invalid context leaseSeconds=14: must be >= 3 x heartbeatSeconds (15)"),
    ("heartbeatSeconds", "0", "invalid context heartbeatSeconds='0': must be > 0"),
    ("reconcileSeconds", "-5", "invalid context reconcileSeconds='-5': must be > 0"),
    ("checkpointSeconds", "x", "invalid context checkpointSeconds='x': must be an integer"),
    (
        "maxClockSkewMs",
        "5000",
        "invalid context maxClockSkewMs=5000: must be >= 0 and < leaseSeconds*1000/4 (5000 ms)",
    ),
    (
        "maxClockSkewMs",
        "-1",
        "invalid context maxClockSkewMs=-1: must be >= 0 and < leaseSeconds*1000/4 (5000 ms)",
    ),
    ("maxConnectionsPerTask", "0", "invalid context maxConnectionsPerTask='0': must be > 0"),
    (
        "stopTimeoutSeconds",
        "121",
        "invalid context stopTimeoutSeconds=121: must be between 2 and 120 (the Fargate stopTimeout limit)",
    ),
    (
        "stopTimeoutSeconds",
        "1",
        "invalid context stopTimeoutSeconds=1: must be between 2 and 120 (the Fargate stopTimeout limit)",
    ),
    ("metricsSeconds", "0", "invalid context metricsSeconds='0': must be > 0"),
    ("sink", "file:/tmp", "invalid context sink='file:/tmp': must be one of kinesis | null | stdout"),
    ("minTasks", "0", "invalid context minTasks='0': must be > 0"),
    (
        "kinesisRetentionHours",
        "12",
        "invalid context kinesisRetentionHours=12: must be between 24 and 8760 hours "
        "(Kinesis Data Streams' retention limits)",
    ),
    (
        "kinesisShards",
        "-1",
        "invalid context kinesisShards=-1: must be 0 (on-demand) or 1..500 (a provisioned stream's shards)",
    ),
    ("allowSingleTaskProd", "yes", "invalid context allowSingleTaskProd='yes': must be true or false"),
    ("cpuArchitecture", "amd64", "invalid context cpuArchitecture='amd64': must be one of x86_64 | arm64"),
    (
        "collectorImage",
        "public.ecr.aws/aws-observability/aws-otel-collector:v0.49.0",
        "invalid context collectorImage='public.ecr.aws/aws-observability/aws-otel-collector:v0.49.0': "
        "must be an image pinned by digest: REPOSITORY[:TAG]@sha256:<64 hex>",
    ),
    ("maxTasks", "0", "invalid context maxTasks='0': must be > 0"),
    (
        "taskCpu",
        "300",
        "invalid context taskCpu=300: must be a Fargate cpu size: 256, 512, 1024, 2048, 4096, 8192, 16384",
    ),
    (
        "taskMemoryMiB",
        "1000",
        "invalid context taskMemoryMiB=1000: must be a Fargate memory size for taskCpu=512: "
        "1024..4096 in steps of 1024",
    ),
    (
        "natGateways",
        "0",
        "invalid context natGateways=0: must be between 1 and 2: workers reach upstream feeds through NAT",
    ),
    (
        "scaleTargetConnections",
        "1001",
        "invalid context scaleTargetConnections=1001: must be <= maxConnectionsPerTask (1000)",
    ),
    ("scaleInCooldownSeconds", "-1", "invalid context scaleInCooldownSeconds=-1: must be between 0 and 3600"),
    (
        "scaleOutCooldownSeconds",
        "7200",
        "invalid context scaleOutCooldownSeconds=7200: must be between 0 and 3600",
    ),
    (
        "alarmEmail",
        "ops-at-example",
        "invalid context alarmEmail='ops-at-example': must be an email address like ops@example.com",
    ),
    (
        "metricsNamespace",
        "bad namespace!",
        "invalid context metricsNamespace='bad namespace!': "
        "must be a CloudWatch namespace ([A-Za-z0-9._/#:-], 1..255)",
    ),
    (
        "upstreamSecrets",
        "feeds/alpaca,bad name!",
        "invalid context upstreamSecrets='feeds/alpaca,bad name!': item 'bad name!' must be a Secrets "
        "Manager secret name (1..512 of A-Za-z0-9/_+=.@-) or a secret ARN "
        "(arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME-XXXXXX)",
    ),
]


@pytest.mark.parametrize(("name", "value", "message"), BAD, ids=[f"{n}={v!r}" for n, v, _ in BAD])
def test_bad_value_gives_one_line_naming_parameter_value_and_rule(
    name: str, value: Any, message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        parse(**{name: value})
    assert str(raised.value) == message
    assert "\n" not in str(raised.value)
    assert raised.value.name == name


def test_every_parameter_has_a_bad_value_case() -> None:
    assert {p.context for p in PARAMETERS} == {name for name, _, _ in BAD}


@pytest.mark.parametrize(
    ("context", "message"),
    [
        ({"maxTasks": "2", "minTasks": "3"}, "invalid context maxTasks=2: must be >= minTasks (3)"),
        (
            {"taskCpu": "4096"},
            "invalid context taskMemoryMiB=1024: must be a Fargate memory size for taskCpu=4096",
        ),
        ({"taskCpu": "256", "taskMemoryMiB": "4096"}, "taskCpu=256: 512, 1024, 2048"),
        ({"heartbeatSeconds": "10"}, "invalid context leaseSeconds=20: must be >= 3 x heartbeatSeconds (30)"),
        (
            {"maxConnectionsPerTask": "500"},
            "invalid context scaleTargetConnections=700: must be <= maxConnectionsPerTask",
        ),
        (
            {"maxConnectionsPerTask": "3000"},
            "invalid context maxConnectionsPerTask=3000: must be <= 1117 in session mode "
            "(one 400 KB checkpoint item per worker)",
        ),
        (
            {"leaseMode": "connection", "maxTasks": "4"},
            "invalid context maxTasks=4: maxTasks x scaleTargetConnections = 4 x 700 = 2800 connections "
            "exceeds the connection-mode index ceiling 500 x heartbeatSeconds = 2500 (docs/design.md §2a); "
            "lower maxTasks or scaleTargetConnections, or raise heartbeatSeconds",
        ),
        ({"natGateways": "3"}, "invalid context natGateways=3: must be between 1 and 2"),
    ],
)
def test_cross_field_rules_name_the_parameter_that_breaks(context: dict[str, str], message: str) -> None:
    with pytest.raises(
        ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")
    ):
        parse(**context)


def test_boundary_values_are_accepted() -> None:
    assert parse(leaseSeconds="15").lease_seconds == 15  # exactly 3 x heartbeat
    assert parse(stopTimeoutSeconds="120").stop_timeout_seconds == 120
    assert parse(stopTimeoutSeconds="2").stop_timeout_seconds == 2
    assert parse(maxClockSkewMs="4999").max_clock_skew_ms == 4999
    assert parse(scaleTargetConnections="1000", maxTasks="2").scale_target_connections == 1000
    assert parse(taskCpu="256", taskMemoryMiB="512").task_memory_mib == 512
    assert parse(minTasks="3", maxTasks="3").max_tasks == 3
    # The connection-mode ceiling is inclusive: 500 x 5 = 2500 = 5 x 500.
    assert parse(maxTasks="5", scaleTargetConnections="500").max_fleet_connections == 2500
    assert parse(heartbeatSeconds="6", leaseSeconds="18", maxTasks="4").max_tasks == 4  # 2800 <= 3000
    assert parse(traceSampleRatio="0").trace_sample_ratio == 0.0
    assert parse(traceSampleRatio="1").trace_sample_ratio == 1.0
    assert parse(traceSampleRatio=1).trace_sample_ratio == 1.0
    assert parse(traceSampleRatio="1e-3").trace_sample_ratio == 0.001


def test_session_mode_has_no_index_ceiling_and_matches_the_worker_limit() -> None:
    """Session mode writes nothing per connection per heartbeat: no connection-mode ceiling.
    Its own limit is the worker's one checkpoint item, and the two numbers agree."""
    from leaseworker.lease.checkpoint_store import check_checkpoint_capacity
    from leaseworker.settings import SettingsError

    cap = config_module.SESSION_MAX_CONNECTIONS_PER_TASK
    check_checkpoint_capacity(cap)  # the worker runs at synth's largest
    with pytest.raises(SettingsError):
        check_checkpoint_capacity(cap + 1)  # and refuses one more, as synth does
    assert parse(leaseMode="session", maxTasks="10").max_fleet_connections == 7000
    with pytest.raises(ConfigError, match="index ceiling"):
        parse(leaseMode="connection", maxTasks="10")
    assert parse(leaseMode="session", maxConnectionsPerTask=str(cap)).lease_mode == "session"


def test_a_plain_deploy_with_credentials_is_told_the_placeholder_account_is_used() -> None:
    note = config_module.placeholder_account_note(parse(), "111122223333")
    assert note == (
        "note: synthesizing for the placeholder account 123456789012 (cdk.json), not your credentials' "
        "111122223333: to deploy, pass -c account=111122223333 -c region=<region> (make deploy does)"
    )
    assert config_module.placeholder_account_note(parse(), None) is None  # offline synth: silent
    assert config_module.placeholder_account_note(parse(account="111122223333"), "111122223333") is None


# --- Unknown context keys ----------------------------------------------------------------------

CDK_KEYS = {
    "aws:cdk:enable-path-metadata": True,
    "aws:cdk:bundling-stacks": ["**"],
    "@aws-cdk/core:checkSecretUsage": True,
    "@aws-cdk-containers/ecs-service-extensions:enableDefaultLogDriver": True,
    "cli-telemetry": False,
    "acknowledged-issue-numbers": [32775],
    "availability-zones:account=123456789012:region=us-east-1": ["us-east-1a"],
}


def parse_keys(**context: Any) -> LeaseworkerConfig:
    return load_config(context.get, context.keys())


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("leaseSecond", "leaseSeconds"),
        ("lease_seconds", "leaseSeconds"),
        ("lease-seconds", "leaseSeconds"),
        ("LeaseSeconds", "leaseSeconds"),
        ("mintasks", "minTasks"),
        ("cpuArch", "cpuArchitecture"),
        ("natGateway", "natGateways"),
    ],
)
def test_a_misspelled_key_is_refused_with_the_nearest_known_one(key: str, meant: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_keys(**CDK_KEYS, **{key: "30"})
    assert str(raised.value) == (
        f"invalid context {key}='30': unknown context key, did you mean `{meant}`? "
        "(every parameter: docs/infrastructure.md#context-parameters)"
    )


def test_an_unrelated_plain_key_is_refused_without_a_guess() -> None:
    with pytest.raises(ConfigError, match="unknown context key, not a leaseworker parameter"):
        parse_keys(flavour="vanilla")


def test_cdk_and_cli_keys_pass_and_every_known_key_passes() -> None:
    context = json.loads((REPO / "cdk.json").read_text())["context"]
    context.update(json.loads((REPO / "cdk.context.json").read_text()))
    assert parse_keys(**{**CDK_KEYS, **context}) == parse()
    assert parse_keys(**{p.context: default_context().get(p.context) for p in PARAMETERS}) == parse()
