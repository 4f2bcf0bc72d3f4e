"""The Sans-I/O adapter interface every upstream protocol implements (docs/design.md §4).

A protocol (`seqfeed/1`, `generic/1`, or a plugin's) is a factory of per-socket adapters. An
adapter never touches a socket, a clock or the network: the session loop hands it frames and
the current time, and it answers with actions. So the session loop has one path for every feed,
and each feed's rules are tested table-driven.

The session's half of the contract:
- before connecting it resolves every reference the protocol names (`references()`: `env:NAME`,
  `secret:NAME#KEY`) and passes the values in `SocketContext.values`;
- it opens the socket that `connect_request()` describes, then calls `on_open()`, then
  `on_frame()` for every frame received, `on_timer()` whenever `next_timer()` has passed, and
  `on_close()` when the socket ends;
- it performs the actions in order: `Send` on the socket; `Emit` and `Gap` become sink records,
  numbered by the session (`seq`); `Ready` means the open steps are done; `Reconnect`, `Fail`,
  `Release` end the socket; `Rotate` opens a successor socket (make-before-break) and, once the
  successor is `Ready`, closes this one; `Dropped` is counted.

The adapter's half: it keeps the per-socket state (open steps, cursors, dedup ids, timers), and
it starts from `SocketContext.resume`, the position the sink has durably accepted (or, after a
reconnect within one epoch, what was delivered). It raises nothing for anything an upstream
sends: a frame it cannot accept becomes an action (`Reconnect`, `Fail`, or `Emit(kind="raw")`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

# Why a socket opens, as a gap marker names it (docs/design.md §5): `connect` for the very first
# socket of a connection (no checkpoint yet), `takeover` for the first socket of a new epoch that
# resumes from another owner's checkpoint, `reconnect` after a socket of the same epoch ended,
# `idle` after a socket was dropped for silence, `rotation` for a make-before-break successor.
OpenReason = Literal["connect", "reconnect", "takeover", "idle", "rotation"]
GapReason = Literal["connect", "reconnect", "takeover", "seq_gap", "idle", "rotation", "cursor_too_old"]
RecordKind = Literal["data", "gap", "raw"]
# How a socket ended, which decides what the session does next:
# - `closed`: the upstream went away (or a keepalive failed): reconnect with backoff;
# - `protocol`: a frame broke the protocol: reconnect, counted as a ProtocolError;
# - `auth`: the upstream refused our credentials: reconnect with backoff, and after repeated
#   refusals the connection is marked failed (`last_error: auth refused ...`);
# - `limit`: a connection-limit or rate-limit refusal (Alpaca 406, HTTP 429): back off, never
#   fail the connection for it;
# - `error`: the upstream sent an error frame: reconnect with backoff, counted toward failure.
EndKind = Literal["closed", "protocol", "auth", "limit", "error"]


@dataclass(frozen=True, slots=True)
class Resume:
    """Where a socket resumes from.

    `cursor` is the JSON value of the last accepted record's cursor (for a keyed feed, a map
    `{key: cursor}`), None when there is none. `seq` is the session's last delivered seq (-1:
    none). `at_ms` is the wall-clock time the last delivered record was received, when known."""

    cursor: Any = None
    seq: int = -1
    at_ms: int | None = None
    reason: OpenReason = "connect"


@dataclass(frozen=True, slots=True)
class SocketContext:
    connection_id: str
    epoch: int
    worker_id: str
    resume: Resume
    # Resolved references: "env:NAME" -> value, "secret:NAME#KEY" -> value. Never logged.
    values: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ConnectRequest:
    url: str  # rendered, secrets included: never log it, log `display_url`
    display_url: str  # the URL with query values redacted
    headers: tuple[tuple[str, str], ...] = ()
    subprotocols: tuple[str, ...] = ()
    compression: bool = True  # permessage-deflate offered
    max_frame_bytes: int = 1024 * 1024
    ping_interval_s: float | None = 20.0  # WebSocket pings (None: off)
    ping_timeout_s: float | None = 20.0
    # Monotonic: the upgrade is not sent after it (a connect budget token counts in the
    # upstream's window only so long; worker/upstream.py TokenLapsed). inf: no budget.
    send_by: float = float("inf")


# ---------------------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class Send:
    frame: str | bytes


@dataclass(frozen=True, slots=True)
class Emit:
    """One record for the sink. The session numbers it (`seq`) and stamps epoch and worker."""

    data: Any
    cursor: Any = None  # the upstream position after this record (JSON value), None if none
    key: str | None = None  # set where the feed's sequences are per key
    kind: Literal["data", "raw"] = "data"
    # The connection-level checkpoint cursor after this record (for a keyed feed the whole
    # `{key: cursor}` map; otherwise equal to `cursor`). It is what a new socket resumes from.
    checkpoint: Any = None


@dataclass(frozen=True, slots=True)
class Gap:
    """A gap marker (docs/design.md §4.3, §5): a hole that could not be avoided, with known bounds."""

    reason: GapReason
    since_ms: int | None = None
    until_ms: int | None = None
    from_cursor: Any = None
    to_cursor: Any = None
    key: str | None = None

    def data(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "reason": self.reason,
            "since_ms": self.since_ms,
            "until_ms": self.until_ms,
            "from_cursor": self.from_cursor,
            "to_cursor": self.to_cursor,
        }
        if self.key is not None:
            body["key"] = self.key
        return body


@dataclass(frozen=True, slots=True)
class Ready:
    """The open steps are done (auth accepted, subscribed): the socket is live."""


@dataclass(frozen=True, slots=True)
class Reconnect:
    reason: str
    kind: EndKind = "closed"
    # The reason the next socket opens for (an idle drop is marked `idle`).
    next_open: OpenReason = "reconnect"


@dataclass(frozen=True, slots=True)
class Fail:
    """The connection can never work as configured: mark it failed with this reason."""

    reason: str


@dataclass(frozen=True, slots=True)
class Release:
    """Someone else owns this connection now (seqfeed/1 `stale_epoch`): stop delivering and
    release the lease conditionally (owner and epoch), so that it is never stranded."""

    reason: str


@dataclass(frozen=True, slots=True)
class Rotate:
    """`lifetime.max_age_s` reached: open a successor socket before this one closes."""


@dataclass(frozen=True, slots=True)
class Dropped:
    """A frame dropped on purpose, counted: an overlapping replay, a duplicate id."""

    reason: Literal["replay", "duplicate"]
    count: int = 1


Action = Send | Emit | Gap | Ready | Reconnect | Fail | Release | Rotate | Dropped


class SocketAdapter(Protocol):
    """The per-socket state machine. `now` is monotonic seconds; `wall_ms` epoch milliseconds."""

    def connect_request(self) -> ConnectRequest: ...

    def on_open(self, now: float, wall_ms: int) -> Sequence[Action]: ...

    def on_frame(self, frame: str | bytes, now: float, wall_ms: int) -> Sequence[Action]: ...

    def on_timer(self, now: float, wall_ms: int) -> Sequence[Action]: ...

    def next_timer(self) -> float | None:
        """The monotonic time at which `on_timer` wants to be called, None if never."""
        ...

    def on_close(self, code: int | None, reason: str, wall_ms: int) -> Sequence[Action]:
        """The socket ended (code None: no close frame). Typically one `Reconnect`."""
        ...


class UpstreamProtocol(Protocol):
    """A connection's protocol, built once per session from the connection item."""

    name: str

    @property
    def resumable(self) -> bool:
        """True when a new socket resumes from the checkpoint cursor (the feed can replay): its
        cursor must then fit a checkpoint entry; otherwise the cursor only bounds gap markers."""
        ...

    def references(self) -> frozenset[str]:
        """The `env:NAME` and `secret:NAME#KEY` references the templates use."""
        ...

    def seq_base(self, start_seq: int) -> int:
        """Record seq = the session's counter - seq_base. seqfeed/1: 0 (the upstream's seq);
        generic/1: start_seq + 1, so that each epoch's records count from 0."""
        ...

    def adapter(self, context: SocketContext, now: float) -> SocketAdapter: ...


class ConfigError(ValueError):
    """A protocol config that does not validate: one line naming the field's path and the rule."""

    def __init__(self, path: str, rule: str) -> None:
        super().__init__(f"{path or '<config>'}: {rule}")
        self.path = path
        self.rule = rule
