"""`atproto-firehose/1`: the atproto repository event stream, `com.atproto.sync.subscribeRepos`.

A Sans-I/O adapter (leaseworker.protocol.adapter). What it models, from the public specs
(atproto.com/specs/event-stream and the subscribeRepos Lexicon):

- the client sends nothing: it connects to the endpoint, with `?cursor=N` to resume after seq N;
- every frame is binary: a DAG-CBOR header `{op, t}` then a DAG-CBOR payload (see frames.py);
- `op: 1` messages carry an integer `seq`, which only increases: gaps are normal (seq is
  monotonic, not contiguous), so a jump is no gap marker; a seq at or below the last accepted one
  is a replay (dropped and counted). The spec's text says a cursor replays from `seq >= cursor`,
  the reference PDS sends `seq > cursor`: either way nothing is delivered twice;
- `#info` with name `OutdatedCursor`: the cursor is older than the server's backfill window, and
  the stream restarts at the oldest seq it still has: a `cursor_too_old` gap marker;
- `op: -1` is an error, after which the server closes: `FutureCursor` (the cursor is ahead of the
  server: its sequence was reset, which only an operator can settle) fails the connection,
  `ConsumerTooSlow` and any other error reconnect;
- unknown `op` values, and unknown `t` values without a `seq`, are ignored, as the spec says.
  A message of an unknown `t` that has a `seq` is delivered like any other (forward compatible).

A frame that is not a well-formed DAG-CBOR frame is delivered as `kind: raw` (base64, with the
error), or ends the socket, by `on_undecodable`. Nothing any upstream sends makes it raise.

Config (`protocol_config`, all optional): `max_frame_bytes` (default 5 MiB: commits carry CAR
blocks and exceed 1 MiB), `start` (`live`: no cursor until there is a checkpoint, the default;
`oldest`: `cursor=0` for the first socket, i.e. the whole backfill window), `idle_timeout_s`
(no frame for that long: reconnect), `on_undecodable` (`raw` | `reconnect` | `fail`).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from leaseworker.protocol.adapter import (
    Action,
    ConfigError,
    ConnectRequest,
    Dropped,
    Emit,
    Fail,
    Gap,
    Ready,
    Reconnect,
    SocketContext,
)
from leaseworker.protocol.registry import ProtocolSpec
from leaseworker_atproto.frames import FrameError, decode_frame

NAME: Final = "atproto-firehose/1"
DEFAULT_MAX_FRAME_BYTES: Final = 5 * 1024 * 1024
MIN_MAX_FRAME_BYTES: Final = 64 * 1024
MAX_MAX_FRAME_BYTES: Final = 64 * 1024 * 1024
FUTURE_CURSOR: Final = "FutureCursor"
CONSUMER_TOO_SLOW: Final = "ConsumerTooSlow"
OUTDATED_CURSOR: Final = "OutdatedCursor"
INFO: Final = "#info"
# The subscribeRepos message types that carry a seq (#handle, #migrate and #tombstone are the
# deprecated ones an old server may still send). A payload of one of them without a seq is broken.
SEQUENCED_TYPES: Final = frozenset(
    {"#commit", "#sync", "#identity", "#account", "#handle", "#migrate", "#tombstone"}
)
_SNIPPET: Final = 200

Start = Literal["live", "oldest"]
OnUndecodable = Literal["raw", "reconnect", "fail"]
_CONFIG_KEYS: Final = frozenset({"protocol", "max_frame_bytes", "start", "idle_timeout_s", "on_undecodable"})


@dataclass(frozen=True, slots=True)
class FirehoseConfig:
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    start: Start = "live"
    idle_timeout_s: float | None = None
    on_undecodable: OnUndecodable = "raw"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_config(raw: Mapping[str, Any] | None) -> FirehoseConfig:
    """The validated config; ConfigError (one line: the field and the rule) if it does not fit."""
    if raw is None:
        return FirehoseConfig()
    if not isinstance(raw, Mapping):
        raise ConfigError("", "must be a JSON object")
    unknown = sorted(str(key) for key in raw if key not in _CONFIG_KEYS)
    if unknown:
        raise ConfigError(unknown[0], f"unknown key (known: {', '.join(sorted(_CONFIG_KEYS))})")
    if "protocol" in raw and raw["protocol"] != NAME:
        raise ConfigError("protocol", f"must be {NAME!r} when given")
    max_frame_bytes = raw.get("max_frame_bytes", DEFAULT_MAX_FRAME_BYTES)
    if not _is_int(max_frame_bytes) or not MIN_MAX_FRAME_BYTES <= max_frame_bytes <= MAX_MAX_FRAME_BYTES:
        raise ConfigError(
            "max_frame_bytes", f"must be an integer from {MIN_MAX_FRAME_BYTES} to {MAX_MAX_FRAME_BYTES}"
        )
    start = raw.get("start", "live")
    if start not in ("live", "oldest"):
        raise ConfigError("start", "must be 'live' or 'oldest'")
    idle = raw.get("idle_timeout_s")
    if idle is not None and (
        isinstance(idle, bool) or not isinstance(idle, int | float) or not math.isfinite(idle) or idle <= 0
    ):
        raise ConfigError("idle_timeout_s", "must be a number of seconds > 0, or null")
    on_undecodable = raw.get("on_undecodable", "raw")
    if on_undecodable not in ("raw", "reconnect", "fail"):
        raise ConfigError("on_undecodable", "must be 'raw', 'reconnect' or 'fail'")
    return FirehoseConfig(
        max_frame_bytes=max_frame_bytes,
        start=start,
        idle_timeout_s=None if idle is None else float(idle),
        on_undecodable=on_undecodable,
    )


def _check_url(url: str) -> None:
    if not isinstance(url, str):
        raise ConfigError("ws_url", "must be a string")
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or parts.port > 0
    except ValueError as error:
        raise ConfigError("ws_url", f"not a URL: {error}") from None
    if parts.scheme not in ("ws", "wss") or not parts.hostname or not port_ok:
        raise ConfigError("ws_url", "must be a ws:// or wss:// URL with a host")
    if parts.fragment:
        raise ConfigError("ws_url", "must not have a fragment")


def url_with_cursor(url: str, cursor: int | None) -> str:
    """`url` with its `cursor` query parameter set to `cursor` (removed when None)."""
    parts = urlsplit(url)
    query = [(key, value) for key, value in parse_qsl(parts.query, keep_blank_values=True) if key != "cursor"]
    if cursor is not None:
        query.append(("cursor", str(cursor)))
    return urlunsplit(parts._replace(query=urlencode(query)))


def display_url(url: str) -> str:
    """The URL for logs: every query value but the cursor's (a seq, never a secret) redacted,
    and any user info dropped."""
    parts = urlsplit(url)
    query = [
        (key, value if key == "cursor" else "***")
        for key, value in parse_qsl(parts.query, keep_blank_values=True)
    ]
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query, safe="*")))


def _resume_seq(cursor: Any) -> int | str | None:
    """The resume cursor as a seq; None if there is none; a string (the problem) if unusable."""
    if cursor is None:
        return None
    if _is_int(cursor) and cursor >= 0:
        return int(cursor)
    if isinstance(cursor, str) and cursor.isascii() and cursor.isdigit():
        return int(cursor)
    return f"the checkpoint cursor {str(cursor)[:_SNIPPET]!r} is not a firehose seq (an integer >= 0)"


def _text(value: Any) -> str:
    return (value if isinstance(value, str) else repr(value))[:_SNIPPET]


class FirehoseAdapter:
    """One socket of one connection: the seq it has accepted, and what the socket asked for."""

    def __init__(self, url: str, config: FirehoseConfig, context: SocketContext, now: float) -> None:
        self._url = url
        self._config = config
        self._context = context
        resume = _resume_seq(context.resume.cursor)
        self._bad_resume = resume if isinstance(resume, str) else None
        # The last seq accepted (delivered by this socket, or the checkpoint it resumes from).
        self._last: int | None = resume if isinstance(resume, int) else None
        if self._bad_resume is not None:
            self._requested: int | None = None
        elif self._last is not None:
            self._requested = self._last
        else:
            self._requested = 0 if config.start == "oldest" else None
        self._last_frame_at = now
        self._outdated_seen = False
        self._ended = False

    # ------------------------------------------------------------------ the session's calls

    def connect_request(self) -> ConnectRequest:
        url = url_with_cursor(self._url, self._requested)
        return ConnectRequest(
            url=url,
            display_url=display_url(url),
            max_frame_bytes=self._config.max_frame_bytes,
        )

    def on_open(self, now: float, wall_ms: int) -> Sequence[Action]:
        self._last_frame_at = now
        if self._bad_resume is not None:
            return [self._end(Fail(self._bad_resume))]
        actions: list[Action] = []
        if self._requested is None:
            # No position to resume from: the stream starts at the server's live position, and
            # whatever it sent before now (since the last socket, if there was one) is not ours.
            resume = self._context.resume
            actions.append(Gap(reason=resume.reason, since_ms=resume.at_ms, until_ms=wall_ms))
        actions.append(Ready())
        return actions

    def on_frame(self, frame: str | bytes, now: float, wall_ms: int) -> Sequence[Action]:
        self._last_frame_at = now
        if self._ended:
            return []
        if isinstance(frame, str):
            return self._undecodable(
                frame.encode("utf-8", "surrogatepass"), "a text frame: the firehose sends binary frames"
            )
        try:
            decoded = decode_frame(bytes(frame))
        except FrameError as error:
            return self._undecodable(frame, str(error))
        except Exception as error:  # the decoder's own bug: still the frame's problem, never ours
            return self._undecodable(frame, f"{type(error).__name__}: {error}"[:400])
        if decoded.op == -1:
            return self._error(decoded.body)
        if decoded.op != 1:
            return []  # the spec: ignore frames of an unknown op
        if decoded.t is None:
            return self._undecodable(frame, "an op 1 header without t")
        if decoded.t == INFO:
            return self._info(decoded.body, wall_ms)
        return self._message(frame, decoded.t, decoded.body)

    def on_timer(self, now: float, wall_ms: int) -> Sequence[Action]:
        idle = self._config.idle_timeout_s
        if self._ended or idle is None or now - self._last_frame_at < idle:
            return []
        return [self._end(Reconnect(f"no frame for {idle:g} s", kind="closed", next_open="idle"))]

    def next_timer(self) -> float | None:
        idle = self._config.idle_timeout_s
        if self._ended or idle is None:
            return None
        return self._last_frame_at + idle

    def on_close(self, code: int | None, reason: str, wall_ms: int) -> Sequence[Action]:
        if self._ended:
            return []
        ended = "without a close frame" if code is None else f"with code {code}"
        detail = f": {_text(reason)}" if reason else ""
        return [self._end(Reconnect(f"the firehose closed {ended}{detail}", kind="closed"))]

    # ------------------------------------------------------------------ frames

    def _message(self, frame: bytes, t: str, body: dict[str, Any]) -> Sequence[Action]:
        if "seq" not in body:
            if t in SEQUENCED_TYPES:
                return self._undecodable(frame, f"a {t} message without seq")
            return []  # an unknown message type without a position: the spec says ignore it
        seq = body["seq"]
        if not _is_int(seq) or seq < 1:
            return self._undecodable(frame, f"a {t} message whose seq is not an integer >= 1: {_text(seq)}")
        if self._last is not None and seq <= self._last:
            return [Dropped("replay")]
        self._last = seq
        data = dict(body)
        data["t"] = t
        return [Emit(data=data, cursor=seq, checkpoint=seq)]

    def _info(self, body: dict[str, Any], wall_ms: int) -> Sequence[Action]:
        if body.get("name") == OUTDATED_CURSOR:
            if self._outdated_seen or not self._requested:
                # Only the first, and only for a real position: after `cursor=0` (start: oldest)
                # the oldest seq kept is exactly what was asked for.
                return []
            self._outdated_seen = True
            resume = self._context.resume
            return [
                Gap(
                    reason="cursor_too_old",
                    since_ms=resume.at_ms,
                    until_ms=wall_ms,
                    from_cursor=self._requested,
                )
            ]
        # Another notice: delivered, at the position the stream is at (it has no seq of its own).
        data = dict(body)
        data["t"] = INFO
        return [Emit(data=data, cursor=self._last, checkpoint=self._last)]

    def _error(self, body: dict[str, Any]) -> Sequence[Action]:
        name = body.get("error")
        message = body.get("message")
        said = f": {_text(message)}" if message is not None else ""
        if not isinstance(name, str) or not name:
            return [self._end(Reconnect(f"an error frame without an error name{said}", kind="protocol"))]
        if name == FUTURE_CURSOR:
            return [
                self._end(
                    Fail(
                        f"{FUTURE_CURSOR}{said}: the firehose has no seq {self._requested} yet, so its "
                        "sequence was reset; resuming needs an operator to reset the checkpoint"
                    )
                )
            ]
        if name == CONSUMER_TOO_SLOW:
            return [self._end(Reconnect(f"{CONSUMER_TOO_SLOW}{said}", kind="error"))]
        return [self._end(Reconnect(f"error frame {_text(name)}{said}", kind="error"))]

    def _undecodable(self, frame: bytes, error: str) -> Sequence[Action]:
        reason = f"an undecodable frame of {len(frame)} bytes: {error}"
        if self._config.on_undecodable == "fail":
            return [self._end(Fail(reason))]
        if self._config.on_undecodable == "reconnect":
            return [self._end(Reconnect(reason, kind="protocol"))]
        data = {"error": error, "frame_base64": base64.b64encode(frame).decode("ascii")}
        return [Emit(data=data, cursor=self._last, checkpoint=self._last, kind="raw")]

    def _end(self, action: Action) -> Action:
        self._ended = True
        return action


class FirehoseProtocol:
    """`atproto-firehose/1` for one connection: its URL and config; one adapter per socket."""

    name: str = NAME
    resumable: bool = True  # a new socket resumes after the checkpoint seq (`cursor=`)

    def __init__(self, ws_url: str, config: FirehoseConfig) -> None:
        _check_url(ws_url)
        self.ws_url = ws_url
        self.config = config

    def references(self) -> frozenset[str]:
        return frozenset()  # a public stream: no secrets, no environment

    def seq_base(self, start_seq: int) -> int:
        # The upstream's seq is not contiguous, so a record's seq is the session's own counter,
        # from 0 in each epoch (as for generic/1); the upstream's seq is the record's cursor.
        return start_seq + 1

    def adapter(self, context: SocketContext, now: float) -> FirehoseAdapter:
        return FirehoseAdapter(self.ws_url, self.config, context, now)


def factory(spec: ProtocolSpec) -> FirehoseProtocol:
    """The entry point (`leaseworker.protocols`, `atproto-firehose/1`): validates, then builds."""
    if spec.name != NAME:
        raise ConfigError("protocol", f"this factory builds {NAME!r}, not {spec.name!r}")
    return FirehoseProtocol(spec.ws_url, parse_config(spec.config))
