"""`seqfeed/1`, the reference upstream protocol (docs/design.md §4).

Client → upstream, first frame:
    {"type":"subscribe","connection_id":ID,"after_seq":N,"epoch":E,"worker_id":W}
Upstream → client:
    {"type":"data","seq":n,"data":...}      n = N+1, N+2, … contiguous, replay first
    {"type":"error","code":...,"message":...} then a close; `stale_epoch` = a higher epoch exists

A data frame at or below the last accepted seq is an overlapping replay: `ReplayedFrame`, which
the session drops and counts (§4.5). Anything else is a ProtocolError, and decoding raises
nothing but ProtocolError whatever the frame holds: a gap; a binary frame (seqfeed/1 is text
only); text that is not strict JSON (including NaN, Infinity, -Infinity and numbers that overflow
to infinity, which no strict JSON sink could write back); JSON nested deeper than
MAX_NESTING_DEPTH (or so deep that the parser itself gives up with RecursionError); a non-object;
a missing or mistyped field (a bool, float, string or negative number as seq); an unknown type;
a frame over MAX_FRAME_BYTES.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, Final

from leaseworker.protocol.adapter import (
    Action,
    ConnectRequest,
    Dropped,
    Emit,
    Ready,
    Reconnect,
    Release,
    Send,
    SocketContext,
)
from leaseworker.protocol.base import DataFrame, ErrorFrame, ProtocolError, ReplayedFrame

NAME: Final = "seqfeed/1"
MAX_FRAME_BYTES: Final = 1024 * 1024
STALE_EPOCH: Final = "stale_epoch"
MAX_NESTING_DEPTH: Final = 128  # arrays/objects, the frame itself being 1; far below recursion limits

_SNIPPET = 80  # how much of a bad frame goes into an error message


def subscribe_frame(*, connection_id: str, after_seq: int, epoch: int, worker_id: str) -> str:
    return json.dumps(
        {
            "type": "subscribe",
            "connection_id": connection_id,
            "after_seq": after_seq,
            "epoch": epoch,
            "worker_id": worker_id,
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )


def _is_int(value: object) -> bool:
    # bool is a subclass of int in Python; `true` is not a sequence number.
    return isinstance(value, int) and not isinstance(value, bool)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not strict JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:_SNIPPET]} overflows to infinity")
    return value


def _nested_deeper_than(message: Any, limit: int) -> bool:
    """Iterative, so that measuring a deep value cannot itself recurse."""
    stack: list[tuple[Any, int]] = [(message, 1)]
    while stack:
        value, depth = stack.pop()
        if not isinstance(value, dict | list):
            continue
        children = value.values() if isinstance(value, dict) else value
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


# Built once: json.loads(frame, parse_constant=..., parse_float=...) builds a new decoder (and its
# scanner) for every call, which cost more than the parse itself for a typical small frame.
_DECODER: Final = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)


def _snippet(frame: str | bytes) -> str:
    text = frame if isinstance(frame, str) else frame[:_SNIPPET].decode("utf-8", "replace")
    return repr(text[:_SNIPPET])


class SeqfeedDecoder:
    """Sans-I/O decoder for one subscription: bytes/text in, frames or ProtocolError out."""

    def __init__(self, after_seq: int) -> None:
        if not _is_int(after_seq) or after_seq < -1:
            raise ValueError(f"after_seq must be an int >= -1, got {after_seq!r}")
        self._last_seq = after_seq

    @property
    def last_seq(self) -> int:
        return self._last_seq

    def decode(self, frame: str | bytes) -> DataFrame | ReplayedFrame | ErrorFrame:
        if not isinstance(frame, str):
            raise ProtocolError("binary", f"binary frame of {len(frame)} bytes: seqfeed/1 frames are text")
        # Size first, before paying for a parse. len() counts code points; a frame of more code
        # points than MAX_FRAME_BYTES is certainly oversized, and otherwise the UTF-8 length
        # decides (encoding is only paid for frames that might be close to the limit).
        if len(frame) > MAX_FRAME_BYTES or (
            len(frame) * 4 > MAX_FRAME_BYTES and _utf8_len(frame) > MAX_FRAME_BYTES
        ):
            raise ProtocolError("oversized", f"frame exceeds {MAX_FRAME_BYTES} bytes")
        try:
            message: Any = _DECODER.decode(frame)
        except RecursionError:
            raise ProtocolError("too_deep", f"JSON nested too deeply to parse: {_snippet(frame)}") from None
        except Exception as exc:  # any parse failure is the upstream's, never the session's
            raise ProtocolError(
                "bad_json", f"not strict JSON ({exc.__class__.__name__}: {exc}): {_snippet(frame)}"[:400]
            ) from None
        # A frame with few brackets cannot be deep: only count levels when it might be.
        if frame.count("[") + frame.count("{") > MAX_NESTING_DEPTH and _nested_deeper_than(
            message, MAX_NESTING_DEPTH
        ):
            raise ProtocolError("too_deep", f"JSON nested deeper than {MAX_NESTING_DEPTH} levels")
        if not isinstance(message, dict):
            raise ProtocolError("bad_frame", f"not a JSON object: {_snippet(frame)}")
        kind = message.get("type")
        if kind == "data":
            return self._data(message)
        if kind == "error":
            return _error(message)
        if kind is None:
            raise ProtocolError("bad_frame", "missing 'type'")
        raise ProtocolError("unexpected", f"unexpected frame type {kind!r}"[: _SNIPPET * 2])

    def _data(self, message: dict[str, Any]) -> DataFrame | ReplayedFrame:
        if "seq" not in message:
            raise ProtocolError("bad_frame", "data frame without 'seq'")
        if "data" not in message:
            raise ProtocolError("bad_frame", "data frame without 'data'")
        seq = message["seq"]
        if not _is_int(seq) or seq < 0:
            raise ProtocolError(
                "bad_frame", f"data frame 'seq' is not an integer >= 0: {seq!r}"[: _SNIPPET * 2]
            )
        if seq <= self._last_seq:
            return ReplayedFrame(seq)  # already accepted: an overlapping replay
        expected = self._last_seq + 1
        if seq != expected:
            # A gap loses messages: resubscribing after the last delivered seq is the fix.
            raise ProtocolError("gap", f"gap: expected seq {expected}, got {seq}")
        self._last_seq = seq
        return DataFrame(seq=seq, data=message["data"])


def _error(message: dict[str, Any]) -> ErrorFrame:
    code = message.get("code")
    text = message.get("message", "")
    if not isinstance(code, str) or not code:
        raise ProtocolError("bad_frame", "error frame without a string 'code'")
    if not isinstance(text, str):
        raise ProtocolError("bad_frame", "error frame 'message' is not a string")
    return ErrorFrame(code=code, message=text)


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


class SeqfeedSocket:
    """The per-socket adapter (protocol/adapter.py): one subscribe frame, then contiguous data.

    A ProtocolError reconnects after the last delivered seq (§4.1 rule 6); `stale_epoch` releases
    the lease, since someone else owns the connection now; any other error frame reconnects."""

    def __init__(self, url: str, context: SocketContext) -> None:
        self._url = url
        self._context = context
        self._decoder = SeqfeedDecoder(context.resume.seq)

    def connect_request(self) -> ConnectRequest:
        return ConnectRequest(url=self._url, display_url=self._url, max_frame_bytes=MAX_FRAME_BYTES)

    def on_open(self, now: float, wall_ms: int) -> Sequence[Action]:
        context = self._context
        subscribe = subscribe_frame(
            connection_id=context.connection_id,
            after_seq=context.resume.seq,
            epoch=context.epoch,
            worker_id=context.worker_id,
        )
        return [Send(subscribe), Ready()]

    def on_frame(self, frame: str | bytes, now: float, wall_ms: int) -> Sequence[Action]:
        try:
            decoded = self._decoder.decode(frame)
        except ProtocolError as error:
            return [Reconnect(f"protocol error: {error}", kind="protocol")]
        if isinstance(decoded, ReplayedFrame):
            return [Dropped("replay")]
        if isinstance(decoded, ErrorFrame):
            if decoded.code == STALE_EPOCH:
                return [Release(f"upstream says stale epoch: {decoded.message}")]
            return [Reconnect(f"upstream error {decoded.code}: {decoded.message}", kind="error")]
        return [Emit(decoded.data)]

    def on_timer(self, now: float, wall_ms: int) -> Sequence[Action]:
        return []

    def next_timer(self) -> float | None:
        return None

    def on_close(self, code: int | None, reason: str, wall_ms: int) -> Sequence[Action]:
        return [Reconnect(f"upstream closed: {code} {reason}".strip())]


class SeqfeedProtocol:
    """The `seqfeed/1` adapter: one subscribe frame, then contiguous data frames."""

    name: str = NAME
    resumable: bool = True

    def __init__(self, url: str = "") -> None:
        self._url = url

    def references(self) -> frozenset[str]:
        return frozenset()

    def seq_base(self, start_seq: int) -> int:
        return 0  # records carry the upstream's own seq

    def adapter(self, context: SocketContext, now: float) -> SeqfeedSocket:
        return SeqfeedSocket(self._url, context)

    def opening_frames(self, *, connection_id: str, after_seq: int, epoch: int, worker_id: str) -> list[str]:
        return [
            subscribe_frame(
                connection_id=connection_id, after_seq=after_seq, epoch=epoch, worker_id=worker_id
            )
        ]

    def decoder(self, after_seq: int) -> SeqfeedDecoder:
        return SeqfeedDecoder(after_seq)
