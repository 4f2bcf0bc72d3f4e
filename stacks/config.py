"""The deployment configuration: CDK context read once into a frozen, validated object.

Only `app.py` (through `load_config`) reads context; constructs receive typed values.
Every default is documented once, in `PARAMETERS` below; cdk.json repeats them so that
`cdk context` shows them, and a test keeps the two in step.

`-c name=value` arrives as a string, cdk.json values arrive as JSON types: both are accepted,
and parsed strictly (no floats for integers, no "yes" for booleans). A broken rule raises
`ConfigError`, whose message is one line naming the parameter, the value and the rule.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from stacks.context_keys import check_context_keys
from stacks.context_values import (
    ACCOUNT_PATTERN,
    NAMESPACE_PATTERN,
    REGION_PATTERN,
    ConfigError,
    parse_bool,
    parse_choice,
    parse_int,
    parse_optional_email,
    parse_pattern,
    parse_positive,
    parse_ratio,
)
from stacks.vocabulary import LEASE_MODES, MAX_ENTRIES_PER_ITEM

__all__ = ["ConfigError", "LeaseworkerConfig", "load_config"]

Stage = Literal["dev", "prod"]
LeaseMode = Literal["connection", "session"]
SinkKind = Literal["kinesis", "null", "stdout"]
CpuArchitecture = Literal["x86_64", "arm64"]

# The Fargate ceiling for a container's stopTimeout (ECS ContainerDefinition.stopTimeout).
FARGATE_MAX_STOP_TIMEOUT_SECONDS = 120

# Valid Fargate task sizes (Linux): cpu units -> allowed memory in MiB.
FARGATE_TASK_SIZES: Mapping[int, tuple[int, ...]] = {
    256: (512, 1024, 2048),
    512: tuple(range(1024, 4096 + 1, 1024)),
    1024: tuple(range(2048, 8192 + 1, 1024)),
    2048: tuple(range(4096, 16384 + 1, 1024)),
    4096: tuple(range(8192, 30720 + 1, 1024)),
    8192: tuple(range(16384, 61440 + 1, 4096)),
    16384: tuple(range(32768, 122880 + 1, 8192)),
}

# The VPC spans this many availability zones; natGateways may not exceed it.
VPC_MAX_AZS = 2

# Session mode keeps a worker's checkpoints in one 400 KB item: the worker refuses more
# MAX_CONNECTIONS than it can hold, and so does synth (the worker's own figure).
SESSION_MAX_CONNECTIONS_PER_TASK = MAX_ENTRIES_PER_ITEM

# docs/design.md §2a: in connection mode every renewal rewrites the by-state-expiry sort key, and
# all STARTED items share one index partition key. One partition takes about 1,000 writes/s
# and a renewal costs about 2 index writes, so the fleet can hold about
# 500 x HEARTBEAT_SECONDS connections. Beyond that the index throttles, which throttles the
# table's renewals and loses leases at scale: synth refuses, it does not merely warn.
GSI_RENEWALS_PER_SECOND_CEILING = 500

# OpenTelemetry sampling (docs/design.md §7, §8): parent-based, with a trace-id ratio from context.
TRACES_SAMPLER = "parentbased_traceidratio"

# The account/region used when none is given: synth is deterministic and offline, and
# cdk.context.json carries the availability-zone facts for exactly this pair.
DEFAULT_ACCOUNT = "123456789012"
DEFAULT_REGION = "us-east-1"

# Upstream secrets (docs/design.md §4.2, §9): Secrets Manager's naming rules. A name is 1..512 of
# ASCII letters, digits and /_+=.@- ; a full ARN ends in the name, a hyphen and the six random
# characters Secrets Manager appends (leaseworker.secret_references parses references by the same rules).
SECRET_NAME_PATTERN = re.compile(r"[A-Za-z0-9/_+=.@-]{1,512}")
SECRET_ARN_PATTERN = re.compile(
    r"arn:aws[-a-z]*:secretsmanager:(?P<region>[a-z]{2}(-[a-z]+)+-[0-9]):(?P<account>[0-9]{12}):"
    r"secret:(?P<name>[A-Za-z0-9/_+=.@-]{1,512})-[A-Za-z0-9]{6}"
)
SECRET_ITEM_RULE = (
    "must be a Secrets Manager secret name (1..512 of A-Za-z0-9/_+=.@-) "
    "or a secret ARN (arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME-XXXXXX)"
)
SECRET_LIST_RULE = "must be a JSON list or a comma-separated string of secret names or ARNs"

# Prod runs at least this many tasks unless allowSingleTaskProd=true: one task is one AZ, and a
# crash, a host retirement or a deploy would orphan every connection at once.
PROD_MIN_TASKS = 2
DEV_MIN_TASKS = 1

# Kinesis data retention (hours): the service's bounds, and the stage defaults (prod: a week,
# so a consumer outage over a weekend loses nothing).
KINESIS_RETENTION_BOUNDS = (24, 8760)
# kinesisShards: 0 is on-demand (no shard math; a per-stream hourly charge), N > 0 is a
# provisioned stream of N shards (1,000 records/s and 1 MiB/s each; cheaper for a quiet fleet).
KINESIS_MAX_SHARDS = 500
DEV_KINESIS_RETENTION_HOURS = 24
PROD_KINESIS_RETENTION_HOURS = 168

# The ADOT collector sidecar, pinned by the digest of its multi-architecture (amd64 + arm64)
# index, so a re-pushed tag can never change what runs. Any override must be pinned the same way
# (e.g. the same digest through an ECR pull-through cache). Digest checked against several
# independent public pins of v0.49.0, not pulled here (no registry access at synth).
COLLECTOR_IMAGE = (
    "public.ecr.aws/aws-observability/aws-otel-collector:v0.49.0"
    "@sha256:d2bdfff2c377c3d71d78bd5d9ce9862fd535b12134a5739d87a07801297cf9fd"
)
DIGEST_PINNED_IMAGE = re.compile(r"[a-z0-9][a-z0-9._/:-]*(:[A-Za-z0-9._-]{1,128})?@sha256:[0-9a-f]{64}")

# The `project` tag on every resource.
PROJECT_TAG = "leaseworker"
# The Powertools `service` dimension the worker's EMF metrics carry (POWERTOOLS_SERVICE_NAME).
SERVICE_NAME = "leaseworker"
# The ADOT sidecar's OTLP/HTTP receiver, reachable on localhost inside the awsvpc task.
OTLP_HTTP_ENDPOINT = "http://localhost:4318"


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseworkerConfig:
    """Everything the stack needs, validated. Field defaults are the documented defaults."""

    stage: Stage = "dev"
    account: str = DEFAULT_ACCOUNT
    region: str = DEFAULT_REGION
    # Lease protocol (docs/design.md §2, §7), passed to the worker as environment variables.
    lease_mode: LeaseMode = "session"
    lease_seconds: int = 20
    heartbeat_seconds: int = 5
    reconcile_seconds: int = 5
    checkpoint_seconds: int = 5
    max_clock_skew_ms: int = 1000
    max_connections_per_task: int = 1000
    stop_timeout_seconds: int = 60
    metrics_seconds: int = 30
    sink: SinkKind = "kinesis"
    # None: the stage's default, see `stream_retention_hours` (dev 24, prod 168).
    kinesis_retention_hours: int | None = None
    kinesis_shards: int = 0
    # Fleet and network. minTasks absent from the context: dev 1, prod PROD_MIN_TASKS (load_config).
    min_tasks: int = DEV_MIN_TASKS
    allow_single_task_prod: bool = False
    # 10 x 700 = 7,000 connections. Session mode (the default) has no index ceiling; connection
    # mode refuses a fleet above 500 x heartbeatSeconds (see GSI_RENEWALS_PER_SECOND_CEILING).
    max_tasks: int = 10
    task_cpu: int = 512
    task_memory_mib: int = 1024
    # Graviton (arm64) is about 20 % cheaper per vCPU-hour; the image is pure Python on
    # manylinux wheels built for both (docs/cost.md).
    cpu_architecture: CpuArchitecture = "x86_64"
    collector_image: str = COLLECTOR_IMAGE
    # None: the stage's default, see `nat_gateway_count` (dev 1, prod one per AZ).
    nat_gateways: int | None = None
    # Autoscaling on the average of ActiveConnections per task.
    scale_target_connections: int = 700
    scale_in_cooldown_seconds: int = 300
    scale_out_cooldown_seconds: int = 60
    # Observability.
    alarm_email: str | None = None
    metrics_namespace: str = "Leaseworker"
    # Fraction of root traces sampled (OTEL_TRACES_SAMPLER_ARG); children follow their parent.
    trace_sample_ratio: float = 0.01
    # Secrets Manager secrets (names or full ARNs) whose values the workers may read for
    # `{{secret:NAME#KEY}}` templates; the task role gets GetSecretValue on exactly these.
    upstream_secrets: tuple[str, ...] = ()

    @property
    def is_prod(self) -> bool:
        return self.stage == "prod"

    @property
    def nat_gateway_count(self) -> int:
        """natGateways if given, else one per AZ in prod (an AZ outage keeps egress) and 1 in dev."""
        if self.nat_gateways is not None:
            return self.nat_gateways
        return VPC_MAX_AZS if self.is_prod else 1

    @property
    def stream_retention_hours(self) -> int:
        """kinesisRetentionHours if given, else a week in prod and the 24 h minimum in dev."""
        if self.kinesis_retention_hours is not None:
            return self.kinesis_retention_hours
        return PROD_KINESIS_RETENTION_HOURS if self.is_prod else DEV_KINESIS_RETENTION_HOURS

    @property
    def max_fleet_connections(self) -> int:
        """What autoscaling can reach: maxTasks tasks at the target average each."""
        return self.max_tasks * self.scale_target_connections

    @property
    def gsi_connection_ceiling(self) -> int:
        """The §2a ceiling of connection mode: about 500 x heartbeatSeconds connections."""
        return GSI_RENEWALS_PER_SECOND_CEILING * self.heartbeat_seconds

    def worker_environment(self) -> dict[str, str]:
        """The config-derived part of the container environment (docs/design.md §7).

        The stack adds the resource-derived variables: TABLE_NAME, NOTIFY_QUEUE_URL, SINK.
        """
        return {
            "LEASE_MODE": self.lease_mode,
            "LEASE_SECONDS": str(self.lease_seconds),
            "HEARTBEAT_SECONDS": str(self.heartbeat_seconds),
            "RECONCILE_SECONDS": str(self.reconcile_seconds),
            "CHECKPOINT_SECONDS": str(self.checkpoint_seconds),
            "MAX_CLOCK_SKEW_MS": str(self.max_clock_skew_ms),
            "MAX_CONNECTIONS": str(self.max_connections_per_task),
            "SHUTDOWN_GRACE_SECONDS": str(self.stop_timeout_seconds),
            "METRICS_SECONDS": str(self.metrics_seconds),
            "POWERTOOLS_SERVICE_NAME": SERVICE_NAME,
            "POWERTOOLS_METRICS_NAMESPACE": self.metrics_namespace,
            "OTEL_EXPORTER_OTLP_ENDPOINT": OTLP_HTTP_ENDPOINT,
            "OTEL_SERVICE_NAME": SERVICE_NAME,
            "OTEL_TRACES_SAMPLER": TRACES_SAMPLER,
            "OTEL_TRACES_SAMPLER_ARG": repr(self.trace_sample_ratio),
        }


# ---------------------------------------------------------------------------------------------
# Parsing: one parser per context parameter, then the cross-field rules.


def parse_upstream_secrets(name: str, raw: object) -> tuple[str, ...]:
    """A list of secret names or ARNs: a JSON list (cdk.json), or from `-c` a JSON list string
    (`-c 'upstreamSecrets=["a","b"]'`) or a comma-separated string (`-c upstreamSecrets=a,b`).

    Duplicates collapse; an empty string or list means none. Each item is checked against
    Secrets Manager's naming rules, and a bad one is named in the one-line error.
    """
    items: object = raw
    if isinstance(raw, str):
        text = raw.strip()
        if text.startswith("["):
            try:
                items = json.loads(text)
            except ValueError:
                raise ConfigError(name, raw, SECRET_LIST_RULE) from None
        else:
            items = [] if not text else text.split(",")
    if not isinstance(items, list | tuple) or not all(isinstance(item, str) for item in items):
        raise ConfigError(name, raw, SECRET_LIST_RULE)
    secrets: list[str] = []
    for item in items:
        secret = item.strip()
        if not (SECRET_NAME_PATTERN.fullmatch(secret) or SECRET_ARN_PATTERN.fullmatch(secret)):
            raise ConfigError(name, raw, f"item {secret!r} {SECRET_ITEM_RULE}")
        if secret not in secrets:
            secrets.append(secret)
    return tuple(secrets)


@dataclass(frozen=True, slots=True)
class Parameter:
    """One context parameter: its context name, the config field, the default and the rule."""

    context: str
    field: str
    parse: Callable[[str, object], object]
    rule: str


PARAMETERS: tuple[Parameter, ...] = (
    Parameter("stage", "stage", lambda n, r: parse_choice(n, r, ("dev", "prod")), "dev | prod"),
    Parameter(
        "account",
        "account",
        lambda n, r: parse_pattern(n, r, ACCOUNT_PATTERN, "must be a 12-digit AWS account id"),
        "12 digits",
    ),
    Parameter(
        "region",
        "region",
        lambda n, r: parse_pattern(n, r, REGION_PATTERN, "must be an AWS region like us-east-1"),
        "an AWS region",
    ),
    Parameter(
        "leaseMode",
        "lease_mode",
        lambda n, r: parse_choice(n, r, LEASE_MODES),
        "connection | session",
    ),
    Parameter("leaseSeconds", "lease_seconds", parse_positive, ">= 3 x heartbeatSeconds"),
    Parameter("heartbeatSeconds", "heartbeat_seconds", parse_positive, "> 0"),
    Parameter("reconcileSeconds", "reconcile_seconds", parse_positive, "> 0"),
    Parameter("checkpointSeconds", "checkpoint_seconds", parse_positive, "> 0"),
    Parameter("maxClockSkewMs", "max_clock_skew_ms", parse_int, ">= 0 and < leaseSeconds*1000/4"),
    Parameter("maxConnectionsPerTask", "max_connections_per_task", parse_positive, "> 0"),
    Parameter("stopTimeoutSeconds", "stop_timeout_seconds", parse_int, "2..120"),
    Parameter("metricsSeconds", "metrics_seconds", parse_positive, "> 0"),
    Parameter(
        "sink",
        "sink",
        lambda n, r: parse_choice(n, r, ("kinesis", "null", "stdout")),
        "kinesis | null | stdout",
    ),
    Parameter(
        "kinesisRetentionHours",
        "kinesis_retention_hours",
        parse_int,
        f"{KINESIS_RETENTION_BOUNDS[0]}..{KINESIS_RETENTION_BOUNDS[1]}; default: dev 24, prod 168",
    ),
    Parameter(
        "kinesisShards",
        "kinesis_shards",
        parse_int,
        f"0 (on-demand) or 1..{KINESIS_MAX_SHARDS} shards (provisioned)",
    ),
    Parameter("minTasks", "min_tasks", parse_positive, f">= 1; default: dev 1, prod {PROD_MIN_TASKS}"),
    Parameter("allowSingleTaskProd", "allow_single_task_prod", parse_bool, "true to let prod run minTasks=1"),
    Parameter("maxTasks", "max_tasks", parse_positive, ">= minTasks"),
    Parameter("taskCpu", "task_cpu", parse_int, "a Fargate cpu size"),
    Parameter("taskMemoryMiB", "task_memory_mib", parse_int, "a Fargate memory size for taskCpu"),
    Parameter(
        "cpuArchitecture",
        "cpu_architecture",
        lambda n, r: parse_choice(n, r, ("x86_64", "arm64")),
        "x86_64 | arm64 (Graviton)",
    ),
    Parameter(
        "collectorImage",
        "collector_image",
        lambda n, r: parse_pattern(
            n, r, DIGEST_PINNED_IMAGE, "must be an image pinned by digest: REPOSITORY[:TAG]@sha256:<64 hex>"
        ),
        "an image reference pinned by digest",
    ),
    Parameter("natGateways", "nat_gateways", parse_int, f"1..{VPC_MAX_AZS}; default: dev 1, prod one per AZ"),
    Parameter(
        "scaleTargetConnections", "scale_target_connections", parse_positive, "<= maxConnectionsPerTask"
    ),
    Parameter("scaleInCooldownSeconds", "scale_in_cooldown_seconds", parse_int, "0..3600"),
    Parameter("scaleOutCooldownSeconds", "scale_out_cooldown_seconds", parse_int, "0..3600"),
    Parameter("alarmEmail", "alarm_email", parse_optional_email, "optional email address"),
    Parameter(
        "metricsNamespace",
        "metrics_namespace",
        lambda n, r: parse_pattern(
            n, r, NAMESPACE_PATTERN, "must be a CloudWatch namespace ([A-Za-z0-9._/#:-], 1..255)"
        ),
        "a CloudWatch namespace",
    ),
    Parameter("traceSampleRatio", "trace_sample_ratio", parse_ratio, "0..1"),
    Parameter(
        "upstreamSecrets",
        "upstream_secrets",
        parse_upstream_secrets,
        "secret names or ARNs in the stack's region (a JSON list or comma-separated)",
    ),
)

CONTEXT_NAMES: Mapping[str, str] = {p.field: p.context for p in PARAMETERS}


def _check(ok: bool, config: LeaseworkerConfig, field: str, rule: str) -> None:
    if not ok:
        raise ConfigError(CONTEXT_NAMES[field], getattr(config, field), rule)


def _describe_sizes(sizes: tuple[int, ...]) -> str:
    steps = {b - a for a, b in itertools.pairwise(sizes)}
    if len(steps) == 1 and len(sizes) > 3:
        return f"{sizes[0]}..{sizes[-1]} in steps of {steps.pop()}"
    return ", ".join(str(s) for s in sizes)


def validate(config: LeaseworkerConfig) -> LeaseworkerConfig:
    """The cross-field rules (docs/design.md §7); each names the parameter that breaks it."""
    c = config
    _check(
        c.lease_seconds >= 3 * c.heartbeat_seconds,
        c,
        "lease_seconds",
        f"must be >= 3 x heartbeatSeconds ({3 * c.heartbeat_seconds})",
    )
    _check(
        0 <= c.max_clock_skew_ms < c.lease_seconds * 1000 / 4,
        c,
        "max_clock_skew_ms",
        f"must be >= 0 and < leaseSeconds*1000/4 ({c.lease_seconds * 1000 // 4} ms)",
    )
    _check(
        2 <= c.stop_timeout_seconds <= FARGATE_MAX_STOP_TIMEOUT_SECONDS,
        c,
        "stop_timeout_seconds",
        f"must be between 2 and {FARGATE_MAX_STOP_TIMEOUT_SECONDS} (the Fargate stopTimeout limit)",
    )
    # Target tracking scales on a metric the workers emit: with zero tasks there is no data
    # and the service could never scale out again, so at least one task always runs.
    _check(c.min_tasks >= 1, c, "min_tasks", "must be >= 1")
    _check(
        not c.is_prod or c.min_tasks >= PROD_MIN_TASKS or c.allow_single_task_prod,
        c,
        "min_tasks",
        f"prod runs at least {PROD_MIN_TASKS} tasks (one task orphans every connection while it is "
        "replaced); pass -c allowSingleTaskProd=true to run fewer on purpose",
    )
    _check(c.max_tasks >= c.min_tasks, c, "max_tasks", f"must be >= minTasks ({c.min_tasks})")
    _check(
        0 <= c.kinesis_shards <= KINESIS_MAX_SHARDS,
        c,
        "kinesis_shards",
        f"must be 0 (on-demand) or 1..{KINESIS_MAX_SHARDS} (a provisioned stream's shards)",
    )
    low, high = KINESIS_RETENTION_BOUNDS
    _check(
        low <= c.stream_retention_hours <= high,
        c,
        "kinesis_retention_hours",
        f"must be between {low} and {high} hours (Kinesis Data Streams' retention limits)",
    )
    _check(
        c.task_cpu in FARGATE_TASK_SIZES,
        c,
        "task_cpu",
        f"must be a Fargate cpu size: {', '.join(str(s) for s in FARGATE_TASK_SIZES)}",
    )
    allowed = FARGATE_TASK_SIZES[c.task_cpu]
    _check(
        c.task_memory_mib in allowed,
        c,
        "task_memory_mib",
        f"must be a Fargate memory size for taskCpu={c.task_cpu}: {_describe_sizes(allowed)}",
    )
    _check(
        1 <= c.nat_gateway_count <= VPC_MAX_AZS,
        c,
        "nat_gateways",
        f"must be between 1 and {VPC_MAX_AZS}: workers reach upstream feeds through NAT",
    )
    _check(
        c.scale_target_connections <= c.max_connections_per_task,
        c,
        "scale_target_connections",
        f"must be <= maxConnectionsPerTask ({c.max_connections_per_task})",
    )
    for field in ("scale_in_cooldown_seconds", "scale_out_cooldown_seconds"):
        _check(0 <= getattr(c, field) <= 3600, c, field, "must be between 0 and 3600")
    if c.lease_mode == "session":
        _check(
            c.max_connections_per_task <= SESSION_MAX_CONNECTIONS_PER_TASK,
            c,
            "max_connections_per_task",
            f"must be <= {SESSION_MAX_CONNECTIONS_PER_TASK} in session mode "
            "(one 400 KB checkpoint item per worker)",
        )
    if c.lease_mode == "connection":
        _check(
            c.max_fleet_connections <= c.gsi_connection_ceiling,
            c,
            "max_tasks",
            f"maxTasks x scaleTargetConnections = {c.max_tasks} x {c.scale_target_connections} = "
            f"{c.max_fleet_connections} connections exceeds the connection-mode index ceiling "
            f"{GSI_RENEWALS_PER_SECOND_CEILING} x heartbeatSeconds = {c.gsi_connection_ceiling} "
            "(docs/design.md §2a); lower maxTasks or scaleTargetConnections, or raise heartbeatSeconds",
        )
    for secret in c.upstream_secrets:
        arn = SECRET_ARN_PATTERN.fullmatch(secret)
        if arn is not None and arn["region"] != c.region:
            raise ConfigError(
                CONTEXT_NAMES["upstream_secrets"],
                secret,
                f"is in region {arn['region']}, but the workers read secrets from their own region "
                f"({c.region}): replicate the secret to {c.region} and name that replica",
            )
    return c


# Parameters whose default depends on the stage: cdk.json must not repeat them, or its value
# would override the stage's.
STAGE_DEFAULTS = ("minTasks", "natGateways", "kinesisRetentionHours")


def load_config(get_context: Callable[[str], Any], keys: Iterable[str] | None = None) -> LeaseworkerConfig:
    """Read every parameter once through `get_context` (e.g. `app.node.try_get_context`).

    `keys`, every context key present (`app.node.get_all_context()`), is checked first: a key
    that looks like ours but is unknown is refused with the nearest known one. A parameter that
    is absent (None) takes its default; minTasks's depends on the stage.
    """
    if keys is not None:
        keys = list(keys)
        check_context_keys(keys, (p.context for p in PARAMETERS), {k: get_context(k) for k in keys})
    values: dict[str, object] = {}
    for parameter in PARAMETERS:
        raw = get_context(parameter.context)
        if raw is None:
            continue
        values[parameter.field] = parameter.parse(parameter.context, raw)
    if "min_tasks" not in values:
        values["min_tasks"] = PROD_MIN_TASKS if values.get("stage") == "prod" else DEV_MIN_TASKS
    return validate(LeaseworkerConfig(**cast(dict[str, Any], values)))


def placeholder_account_note(config: LeaseworkerConfig, credentials_account: str | None) -> str | None:
    """A one-line note when the CLI found credentials (CDK_DEFAULT_ACCOUNT) but the stack still
    targets the placeholder account: a deploy would fail with an account mismatch."""
    if config.account != DEFAULT_ACCOUNT or not credentials_account or credentials_account == DEFAULT_ACCOUNT:
        return None
    return (
        f"note: synthesizing for the placeholder account {DEFAULT_ACCOUNT} (cdk.json), not your "
        f"credentials' {credentials_account}: to deploy, pass -c account={credentials_account} "
        "-c region=<region> (make deploy does)"
    )


def default_context() -> dict[str, object]:
    """The documented defaults keyed by context name (what cdk.json repeats)."""
    defaults = LeaseworkerConfig()
    context: dict[str, object] = {}
    for p in PARAMETERS:
        value = getattr(defaults, p.field)
        if value is not None and p.context not in STAGE_DEFAULTS:
            context[p.context] = list(value) if isinstance(value, tuple) else value  # JSON: a list
    return context
