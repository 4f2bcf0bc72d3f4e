"""The `generic/1` config as a frozen typed model (docs/design.md §4.2); `config.parse_config` builds
it from JSON. Defaults live here, once: the section a config leaves out takes these values.
Pointers and templates are already parsed, so a socket only resolves and renders them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from leaseworker.protocol.generic.pointers import Pointer
from leaseworker.protocol.generic.templates import SendTemplate, Template, references_in

NAME: Final = "generic/1"
MAX_CONFIG_BYTES: Final = 16 * 1024
MiB: Final = 1024 * 1024
DEFAULT_PING_S: Final = 20.0
DEFAULT_EXPECT_TIMEOUT_S: Final = 10.0

Table = tuple[tuple[Pointer, Any], ...]  # (pointer, expected JSON value): all must hold
Refusal = Literal["auth", "limit", "error"]
Action = Literal["data", "ignore", "heartbeat", "error", "reconnect"]
Decode = Literal["json", "text", "binary_base64"]
Order = Literal["strict", "monotonic", "none"]
ResumeIn = Literal["url", "open", "none"]


@dataclass(frozen=True, slots=True)
class ConnectConfig:
    url: Template
    headers: tuple[tuple[str, Template], ...] = ()
    subprotocols: tuple[str, ...] = ()
    compression: bool = True
    max_frame_bytes: int = MiB


@dataclass(frozen=True, slots=True)
class SendStep:
    send: SendTemplate


@dataclass(frozen=True, slots=True)
class ExpectStep:
    match: Table
    fail: Table = ()
    timeout_s: float = DEFAULT_EXPECT_TIMEOUT_S
    refusal: Refusal = "auth"


@dataclass(frozen=True, slots=True)
class ClassifyRule:
    when: Table
    action: Action
    message: Pointer | None = None  # action error: where the upstream's message is
    refusal: Refusal = "error"  # action error: how the socket ends
    cursor: Pointer | None = None  # action heartbeat: the upstream's position it reports


@dataclass(frozen=True, slots=True)
class FramesConfig:
    decode: Decode = "json"
    split: Pointer | None = None
    unwrap: Pointer | None = None
    classify: tuple[ClassifyRule, ...] = ()
    on_undecodable: Literal["raw", "fail"] = "raw"


@dataclass(frozen=True, slots=True)
class CursorConfig:
    path: Pointer | None = None
    order: Order = "none"
    key: Pointer | None = None
    resume_in: ResumeIn = "none"
    inclusive: bool = False

    @property
    def replayable(self) -> bool:
        return self.resume_in != "none"


@dataclass(frozen=True, slots=True)
class GapsConfig:
    first: Pointer
    last: Pointer


@dataclass(frozen=True, slots=True)
class AppPing:
    every_s: float
    send: SendTemplate


@dataclass(frozen=True, slots=True)
class KeepaliveConfig:
    ping_interval_s: float | None = DEFAULT_PING_S
    ping_timeout_s: float | None = DEFAULT_PING_S
    idle_timeout_s: float | None = None
    app_ping: AppPing | None = None


@dataclass(frozen=True, slots=True)
class BudgetConfig:
    count: int
    seconds: float
    host: str | None = None  # None: the URL's host and port


@dataclass(frozen=True, slots=True)
class GenericConfig:
    connect: ConnectConfig
    open: tuple[SendStep | ExpectStep, ...] = ()
    frames: FramesConfig = FramesConfig()
    cursor: CursorConfig = CursorConfig()
    gaps: GapsConfig | None = None
    keepalive: KeepaliveConfig = KeepaliveConfig()
    max_age_s: float | None = None  # lifetime.max_age_s
    dedup_id: Pointer | None = None
    budget: BudgetConfig | None = None

    def references(self) -> frozenset[str]:
        return references_of(self)


def references_of(config: GenericConfig) -> frozenset[str]:
    """Every `env:NAME` and `secret:NAME#KEY` the config's templates use."""
    names: set[str] = set(config.connect.url.names())
    for _, template in config.connect.headers:
        names |= template.names()
    for step in config.open:
        if isinstance(step, SendStep):
            names |= step.send.names()
    if config.keepalive.app_ping is not None:
        names |= config.keepalive.app_ping.send.names()
    return references_in(frozenset(names))
