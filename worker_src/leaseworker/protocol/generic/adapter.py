"""`generic/1` (docs/design.md §4.2): a feed described by data, run by one Sans-I/O socket adapter.

GenericProtocol is built once per session from the validated config; each socket gets a
GenericSocket, which turns the socket's events into actions (protocol/adapter.py):

    connecting --on_open--> opening (open steps: sends, and expects with a timeout)
               --all steps done: Ready--> ready (frames become records)
               --Reconnect / Fail / on_close--> ended (every later event: no action)

A frame is decoded (decode.py), classified on the frame as received (first rule wins, default
data), split into records, unwrapped, and each record is judged against the socket's positions
(positions.py): a replay or a duplicate id is Dropped; a hole on a feed that can replay ends the
socket (the next one resumes from the checkpoint: nothing lost, no marker), and on a feed that
cannot, a Gap marker goes before the record. A feed that cannot replay also marks every socket's
start: the marker is held until the socket's first record, so it bounds the hole on both sides.
Frames that arrive while an expect waits, and that are data, are held and delivered once Ready.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from leaseworker.protocol.adapter import (
    Action,
    ConfigError,
    ConnectRequest,
    EndKind,
    Fail,
    Ready,
    Reconnect,
    Rotate,
    Send,
    SocketContext,
)
from leaseworker.protocol.generic.config import parse_config
from leaseworker.protocol.generic.decode import Undecodable, decode, snippet
from leaseworker.protocol.generic.frames import Records, classify, one_line
from leaseworker.protocol.generic.model import NAME, ExpectStep, GenericConfig, references_of
from leaseworker.protocol.generic.pointers import matches
from leaseworker.protocol.generic.templates import SendTemplate, Values, redact_url

MAX_HELD_FRAMES: Final = 10_000  # data frames held while an open step waits
_HTTP_STATUS: Final = re.compile(r"\bHTTP (\d{3})\b")
_AUTHISH: Final = re.compile(r"auth|token|credential|forbidden|permission|api.?key|login|signature", re.I)
_LIMITISH: Final = re.compile(r"rate|limit|too many", re.I)

State = Literal["connecting", "opening", "ready", "ended"]
_ENDING: Final = (Reconnect, Fail)  # the actions that end a socket (a tuple: the fastest isinstance)


class GenericProtocol:
    """The `generic/1` protocol of one connection: its validated config."""

    name: str = NAME

    def __init__(self, config: GenericConfig | Mapping[str, Any] | str) -> None:
        self.config = config if isinstance(config, GenericConfig) else parse_config(config)
        self._references = references_of(self.config)

    @property
    def resumable(self) -> bool:
        """The checkpoint cursor goes into the URL or an open step: the feed can replay."""
        return self.config.cursor.resume_in != "none"

    def references(self) -> frozenset[str]:
        return self._references

    def seq_base(self, start_seq: int) -> int:
        return start_seq + 1

    def adapter(self, context: SocketContext, now: float) -> GenericSocket:
        """Raises ConfigError when a reference the templates use has no value (an unset
        environment variable): the session resolves them all first, so that is a bad config."""
        missing = sorted(self._references - set(context.values))
        if missing:
            raise ConfigError("", f"{missing[0]} has no value")
        return GenericSocket(self.config, context, now)


def close_kind(code: int | None, reason: str) -> EndKind:
    """How a close (or a refused handshake, `HTTP 401`) ends the socket."""
    status = _HTTP_STATUS.search(reason) if code is None else None
    if status is not None:
        number = int(status.group(1))
        if number in (401, 403):
            return "auth"
        if number == 429:
            return "limit"
    if code == 1008:  # policy violation: what a feed closes with when it refuses us
        if _AUTHISH.search(reason):
            return "auth"
        if _LIMITISH.search(reason):
            return "limit"
    return "closed"


class GenericSocket:
    """One socket of a `generic/1` feed. `now` is monotonic seconds, `wall_ms` epoch ms."""

    __slots__ = (  # one per socket: no __dict__
        "_config",
        "_context",
        "_deadline",
        "_decode_mode",
        "_held",
        "_idle_at",
        "_idle_timeout_s",
        "_max_frame_bytes",
        "_msg_id",
        "_ping_at",
        "_records",
        "_rotate_at",
        "_state",
        "_step",
    )

    def __init__(self, config: GenericConfig, context: SocketContext, now: float) -> None:
        self._config = config
        self._context = context
        self._records = Records(config, context)
        self._state: State = "connecting"
        self._step = 0
        self._deadline: float | None = None  # the waiting expect's timeout
        self._held: list[tuple[Any, int]] = []
        self._idle_at: float | None = None
        self._ping_at: float | None = None
        self._rotate_at: float | None = None
        self._msg_id = 0
        # Read on every frame: looked up once.
        self._idle_timeout_s = config.keepalive.idle_timeout_s
        self._decode_mode = config.frames.decode
        self._max_frame_bytes = config.connect.max_frame_bytes

    # ------------------------------------------------------------------------- rendering

    def _values(self, *, cursor_in: str, masked: bool = False, msg_id: int = 0) -> Values:
        context = self._context
        cursor = context.resume.cursor if self._config.cursor.resume_in == cursor_in else None
        references = {name: "***" for name in context.values} if masked else context.values
        return Values(context.connection_id, context.epoch, context.worker_id, cursor, msg_id, references)

    def _send(self, template: SendTemplate) -> Send:
        self._msg_id += 1
        return Send(template.render(self._values(cursor_in="open", msg_id=self._msg_id)))

    def connect_request(self) -> ConnectRequest:
        connect, keepalive = self._config.connect, self._config.keepalive
        values = self._values(cursor_in="url")
        return ConnectRequest(
            url=connect.url.render(values, url=True),
            display_url=redact_url(connect.url.render(self._values(cursor_in="url", masked=True), url=True)),
            headers=tuple((name, template.render(values, header=True)) for name, template in connect.headers),
            subprotocols=connect.subprotocols,
            compression=connect.compression,
            max_frame_bytes=connect.max_frame_bytes,
            ping_interval_s=keepalive.ping_interval_s,
            ping_timeout_s=keepalive.ping_timeout_s,
        )

    # ---------------------------------------------------------------------------- events

    def on_open(self, now: float, wall_ms: int) -> Sequence[Action]:
        if self._state != "connecting":
            return []
        self._state = "opening"
        keepalive = self._config.keepalive
        if keepalive.idle_timeout_s is not None:
            self._idle_at = now + keepalive.idle_timeout_s
        if self._config.max_age_s is not None:
            self._rotate_at = now + self._config.max_age_s
        return self._advance(now)

    def _advance(self, now: float) -> list[Action]:
        """Run open steps from the current one until an expect waits, then Ready."""
        actions: list[Action] = []
        steps = self._config.open
        while self._step < len(steps):
            step = steps[self._step]
            if isinstance(step, ExpectStep):
                self._deadline = now + step.timeout_s
                return actions
            actions.append(self._send(step.send))
            self._step += 1
        self._deadline = None
        self._state = "ready"
        actions.append(Ready())
        app_ping = self._config.keepalive.app_ping
        if app_ping is not None:
            self._ping_at = now + app_ping.every_s
        held, self._held = self._held, []
        for decoded, wall_ms in held:
            actions.extend(self._process(decoded, wall_ms))
            if self._ended():
                break
        return actions

    def on_frame(self, frame: str | bytes, now: float, wall_ms: int) -> Sequence[Action]:
        state = self._state
        if state == "ended":
            return []
        if self._idle_timeout_s is not None and self._idle_at is not None:
            self._idle_at = now + self._idle_timeout_s
        decoded = decode(frame, self._decode_mode, self._max_frame_bytes)
        if state == "ready":
            return self._process(decoded, wall_ms)
        if self._state == "opening" and not isinstance(decoded, Undecodable):
            step = self._config.open[self._step]
            assert isinstance(step, ExpectStep)
            if step.fail and matches(decoded, step.fail):
                what = "auth" if step.refusal == "auth" else step.refusal
                return self._end(Reconnect(f"{what} refused: {snippet(decoded)}", kind=step.refusal))
            if matches(decoded, step.match):
                self._step += 1
                return self._advance(now)
            rule = classify(self._config, decoded)
            if rule is not None and rule.action in ("ignore", "error", "reconnect"):
                return self._process(decoded, wall_ms)
        return self._hold(decoded, wall_ms)

    def _hold(self, decoded: Any, wall_ms: int) -> list[Action]:
        if len(self._held) >= MAX_HELD_FRAMES:
            return self._end(
                Reconnect(f"{MAX_HELD_FRAMES} data frames before the open steps ended", "protocol")
            )
        self._held.append((decoded, wall_ms))
        return []

    def next_timer(self) -> float | None:
        if self._state in ("connecting", "ended"):
            return None
        times = [
            self._idle_at,
            self._rotate_at,
            self._deadline if self._state == "opening" else self._ping_at,
        ]
        pending = [time for time in times if time is not None]
        return min(pending) if pending else None

    def on_timer(self, now: float, wall_ms: int) -> Sequence[Action]:
        if self._state in ("connecting", "ended"):
            return []
        if self._state == "opening" and self._deadline is not None and now >= self._deadline:
            step = self._config.open[self._step]
            assert isinstance(step, ExpectStep)
            return self._end(
                Reconnect(f"open step {self._step} timed out after {step.timeout_s:g} s", "protocol")
            )
        if self._idle_at is not None and now >= self._idle_at:
            idle = self._config.keepalive.idle_timeout_s
            return self._end(Reconnect(f"idle: no frame for {idle:g} s", "closed", next_open="idle"))
        actions: list[Action] = []
        if self._rotate_at is not None and now >= self._rotate_at:
            self._rotate_at = None  # once
            actions.append(Rotate())
        app_ping = self._config.keepalive.app_ping
        if app_ping is not None and self._ping_at is not None and now >= self._ping_at:
            self._ping_at = now + app_ping.every_s
            actions.append(self._send(app_ping.send))
        return actions

    def on_close(self, code: int | None, reason: str, wall_ms: int) -> Sequence[Action]:
        if self._state == "ended":
            return []
        said = f"code {code} {reason}" if code is not None else (reason or "no close frame")
        return self._end(Reconnect(one_line(f"upstream closed: {said}"), close_kind(code, reason)))

    def _end(self, action: Reconnect | Fail) -> list[Action]:
        self._state = "ended"
        self._held = []
        return [action]

    def _ended(self) -> bool:
        return self._state == "ended"

    def _process(self, decoded: Any, wall_ms: int) -> list[Action]:
        actions = self._records.process(decoded, wall_ms)
        if actions and isinstance(actions[-1], _ENDING):
            self._state = "ended"
            self._held = []
        return actions
