"""The worker's settings: one frozen object, read from the environment once, validated.

Every default is documented once, here (docs/design.md §7 mirrors it). A broken rule raises
`SettingsError` whose message is one line naming the variable, the value and the rule.
"""

from __future__ import annotations

import math
import os
import re
import secrets
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, cast

LeaseMode = Literal["connection", "session"]

DEFAULT_TABLE = "leaseworker-connections"
DEFAULT_LEASE_SECONDS = 20.0
ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
SHUTDOWN_GRACE_LIMIT_SECONDS = 120  # the Fargate stopTimeout ceiling
NOT_FINITE_RULE = "must be a finite number, not NaN or infinity"


class SettingsError(ValueError):
    """A configuration value broke a rule; str() is the one-line explanation."""

    def __init__(self, name: str, value: object, rule: str) -> None:
        super().__init__(f"invalid {name}={value!r}: {rule}")
        self.name = name
        self.value = value
        self.rule = rule


@dataclass(frozen=True, slots=True)
class Settings:
    table_name: str = DEFAULT_TABLE
    lease_mode: LeaseMode = "session"
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    heartbeat_seconds: float = 5.0
    reconcile_seconds: float = 5.0  # the seed reconciled every 60 s; see docs/design.md §2a
    checkpoint_seconds: float = 5.0
    max_clock_skew_ms: int = 1000
    max_connections: int = 1000
    metrics_seconds: float = 30.0
    shutdown_grace_seconds: float = 60.0
    sink: str = "stdout"
    notify_queue_url: str | None = None
    worker_id: str = ""
    allow_insecure_ws: bool = False
    otel_endpoint: str | None = None
    endpoint_url: str | None = None
    region: str | None = None

    def __post_init__(self) -> None:
        self.validate()

    def numbers(self) -> tuple[tuple[str, float], ...]:
        """Every numeric setting, by its environment variable."""
        return (
            ("LEASE_SECONDS", self.lease_seconds),
            ("HEARTBEAT_SECONDS", self.heartbeat_seconds),
            ("RECONCILE_SECONDS", self.reconcile_seconds),
            ("CHECKPOINT_SECONDS", self.checkpoint_seconds),
            ("MAX_CLOCK_SKEW_MS", self.max_clock_skew_ms),
            ("MAX_CONNECTIONS", self.max_connections),
            ("METRICS_SECONDS", self.metrics_seconds),
            ("SHUTDOWN_GRACE_SECONDS", self.shutdown_grace_seconds),
        )

    @property
    def max_clock_skew_seconds(self) -> float:
        return self.max_clock_skew_ms / 1000.0

    @property
    def fence_margin_seconds(self) -> float:
        """Safety margin subtracted from the local lease deadline (docs/design.md §2d).

        A tenth of the lease, at most one heartbeat: enough to cover event-loop latency
        between checking validity and the sink write, without fencing on every hiccup.
        """
        return min(self.lease_seconds / 10.0, self.heartbeat_seconds)

    @property
    def local_validity_seconds(self) -> float:
        """How long a lease stays valid locally after the renewal that confirmed it was sent."""
        return self.lease_seconds - self.max_clock_skew_seconds - self.fence_margin_seconds

    def validate(self) -> None:
        for name, number in self.numbers():
            # NaN compares false with everything, so without this every rule below would pass it.
            if isinstance(number, float) and not math.isfinite(number):  # an int is always finite
                raise SettingsError(name, number, NOT_FINITE_RULE)
        if not self.table_name:
            raise SettingsError("TABLE_NAME", self.table_name, "is required")
        if self.lease_mode not in ("connection", "session"):
            raise SettingsError("LEASE_MODE", self.lease_mode, "must be one of connection, session")
        for name, value in (
            ("HEARTBEAT_SECONDS", self.heartbeat_seconds),
            ("RECONCILE_SECONDS", self.reconcile_seconds),
            ("CHECKPOINT_SECONDS", self.checkpoint_seconds),
            ("METRICS_SECONDS", self.metrics_seconds),
            ("MAX_CONNECTIONS", self.max_connections),
            ("SHUTDOWN_GRACE_SECONDS", self.shutdown_grace_seconds),
        ):
            if value <= 0:
                raise SettingsError(name, value, "must be > 0")
        if self.lease_seconds < 3 * self.heartbeat_seconds:
            raise SettingsError(
                "LEASE_SECONDS",
                self.lease_seconds,
                f"must be >= 3 x HEARTBEAT_SECONDS ({3 * self.heartbeat_seconds:g})",
            )
        if self.max_clock_skew_ms < 0 or self.max_clock_skew_ms >= self.lease_seconds * 1000 / 4:
            raise SettingsError(
                "MAX_CLOCK_SKEW_MS",
                self.max_clock_skew_ms,
                f"must be >= 0 and < LEASE_SECONDS/4 ({self.lease_seconds * 1000 / 4:g} ms)",
            )
        if self.shutdown_grace_seconds > SHUTDOWN_GRACE_LIMIT_SECONDS:
            raise SettingsError(
                "SHUTDOWN_GRACE_SECONDS",
                self.shutdown_grace_seconds,
                f"must be <= {SHUTDOWN_GRACE_LIMIT_SECONDS} (the Fargate stopTimeout limit)",
            )
        if not ID_PATTERN.fullmatch(self.worker_id):
            raise SettingsError("WORKER_ID", self.worker_id, "must match [A-Za-z0-9._:-]{1,128}")
        validate_sink(self.sink)
        if self.lease_mode == "session":
            # One checkpoint item per worker holds every entry (docs/design.md §2b). Imported here:
            # the store module itself depends on this one.
            from leaseworker.lease.checkpoint_store import check_checkpoint_capacity

            check_checkpoint_capacity(self.max_connections)


def validate_sink(spec: str) -> None:
    kind, _, arg = spec.partition(":")
    if kind in ("stdout", "null") and not arg:
        return
    if kind in ("kinesis", "file") and arg:
        return
    raise SettingsError("SINK", spec, "must be stdout, null, file:<dir> or kinesis:<stream>")


def default_worker_id(env: Mapping[str, str]) -> str:
    """ECS task id + suffix on Fargate; host-pid-suffix locally (docs/design.md §3)."""
    suffix = secrets.token_hex(3)
    metadata_uri = env.get("ECS_CONTAINER_METADATA_URI_V4", "")
    if metadata_uri:
        # The v4 metadata URI ends in the task id followed by a container-scoped suffix:
        # .../v4/<task-id>-<n>; the task id is what operators see in the console.
        task_part = metadata_uri.rstrip("/").rsplit("/", 1)[-1].split("-", 1)[0]
        base = re.sub(r"[^A-Za-z0-9._:-]", "-", task_part)[:100] or "ecs"
        return f"{base}-{suffix}"
    host = re.sub(r"[^A-Za-z0-9._:-]", "-", socket.gethostname())[:80] or "host"
    return f"{host}-{os.getpid()}-{suffix}"


def _number(env: Mapping[str, str], name: str, default: float, parse: Callable[[str], float]) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    text = raw.strip()
    try:
        value = parse(text)
    except ValueError:
        # int() refuses "nan", "inf" and "1e999" too: say why when that is the reason.
        kind = "an integer" if parse is int else "a number"
        raise SettingsError(name, raw, NOT_FINITE_RULE if _non_finite(text) else f"must be {kind}") from None
    # float() reads "nan", "inf", "-Infinity", and overflows "1e999" to inf.
    if isinstance(value, float) and not math.isfinite(value):
        raise SettingsError(name, raw, NOT_FINITE_RULE)
    return value


def _non_finite(text: str) -> bool:
    try:
        return not math.isfinite(float(text))
    except ValueError:
        return False


def allow_insecure_ws_from(env: Mapping[str, str]) -> bool:
    """ALLOW_INSECURE_WS alone, for the operator CLI: `connections add/apply` refuse `ws://` to
    a non-loopback host exactly as the worker does."""
    return _bool(env, "ALLOW_INSECURE_WS", False)


def lease_seconds_from(env: Mapping[str, str]) -> float:
    """LEASE_SECONDS alone, for the operator CLI: `remove --force` watches an unrenewed lease for
    that long on its own clock before it calls it expired (lease/removal.py)."""
    lease = float(_number(env, "LEASE_SECONDS", DEFAULT_LEASE_SECONDS, float))
    if not lease > 0 or lease == float("inf"):
        raise SettingsError("LEASE_SECONDS", lease, "must be a finite number > 0")
    return lease


def max_clock_skew_ms_from(env: Mapping[str, str]) -> int:
    """MAX_CLOCK_SKEW_MS alone, for the operator CLI, which judges lease expiry like an acquirer."""
    skew = int(_number(env, "MAX_CLOCK_SKEW_MS", 1000, int))
    if skew < 0:
        raise SettingsError("MAX_CLOCK_SKEW_MS", skew, "must be >= 0")
    return skew


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise SettingsError(name, raw, "must be true or false")


def load_settings(
    env: Mapping[str, str] | None = None, *, sink: str | None = None, worker_id: str | None = None
) -> Settings:
    """Read the environment once. `sink` and `worker_id` (CLI flags) win over the environment."""
    source: Mapping[str, str] = os.environ if env is None else env
    return Settings(
        table_name=source.get("TABLE_NAME", DEFAULT_TABLE),
        # An unknown mode is refused by validate(), with the rule, like every other value.
        lease_mode=cast(LeaseMode, source.get("LEASE_MODE", "session").strip() or "session"),
        lease_seconds=_number(source, "LEASE_SECONDS", DEFAULT_LEASE_SECONDS, float),
        heartbeat_seconds=_number(source, "HEARTBEAT_SECONDS", 5.0, float),
        reconcile_seconds=_number(source, "RECONCILE_SECONDS", 5.0, float),
        checkpoint_seconds=_number(source, "CHECKPOINT_SECONDS", 5.0, float),
        max_clock_skew_ms=int(_number(source, "MAX_CLOCK_SKEW_MS", 1000, int)),
        max_connections=int(_number(source, "MAX_CONNECTIONS", 1000, int)),
        metrics_seconds=_number(source, "METRICS_SECONDS", 30.0, float),
        shutdown_grace_seconds=_number(source, "SHUTDOWN_GRACE_SECONDS", 60.0, float),
        sink=sink or source.get("SINK", "stdout").strip() or "stdout",
        notify_queue_url=source.get("NOTIFY_QUEUE_URL") or None,
        worker_id=worker_id or source.get("WORKER_ID") or default_worker_id(source),
        allow_insecure_ws=_bool(source, "ALLOW_INSECURE_WS", False),
        otel_endpoint=source.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None,
        # DynamoDB's endpoint; other services keep botocore's own resolution of AWS_ENDPOINT_URL(_<SERVICE>).
        endpoint_url=source.get("AWS_ENDPOINT_URL_DYNAMODB") or source.get("AWS_ENDPOINT_URL") or None,
        region=source.get("AWS_REGION") or source.get("AWS_DEFAULT_REGION") or None,
    )
