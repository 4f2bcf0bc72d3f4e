"""Turning one WebSocket frame into a value, by `frames.decode`, without ever raising.

`json` is strict like seqfeed/1's decoder: no NaN or Infinity (nor numbers that overflow to
infinity), at most MAX_NESTING_DEPTH levels, at most `max_frame_bytes`, and UTF-8 for a binary
frame. `text` takes a text frame as is (a binary frame is undecodable: binary where text was
expected). `binary_base64` delivers the frame's bytes as base64 text (a text frame's UTF-8).
A frame that fails becomes Undecodable, which the socket delivers as `kind: raw` or turns into
a Fail, by `frames.on_undecodable`.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from typing import Any, Final, Literal

MAX_NESTING_DEPTH: Final = 128  # arrays/objects, the frame itself being 1 (as seqfeed/1)
RAW_OVERSIZED_CHARS: Final = 1024  # how much of an oversized frame a raw record carries
_SNIPPET: Final = 80


@dataclass(frozen=True, slots=True)
class Undecodable:
    frame: str  # the frame as text, or its bytes as base64
    encoding: Literal["text", "base64"]
    error: str  # one line

    def data(self) -> dict[str, Any]:
        return {"frame": self.frame, "encoding": self.encoding, "error": self.error}


def raw(frame: str | bytes, error: str, *, limit: int | None = None) -> Undecodable:
    """A frame as a raw record's data (cut to `limit` characters or bytes when given)."""
    one_line = " ".join(error.split())[:300]
    if isinstance(frame, str):
        return Undecodable(frame if limit is None else frame[:limit], "text", one_line)
    data = frame if limit is None else frame[:limit]
    return Undecodable(base64.b64encode(data).decode("ascii"), "base64", one_line)


def snippet(value: Any) -> str:
    """A short, one-line, printable excerpt of a frame or a value, for reasons and errors."""
    if isinstance(value, bytes):
        text = value[:_SNIPPET].decode("utf-8", "replace")
    elif isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        except (ValueError, TypeError, RecursionError):
            text = "<unprintable>"
    return repr(text[:_SNIPPET])[1:-1]


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not strict JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:_SNIPPET]} overflows to infinity")
    return value


_DECODER: Final = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Iterative, so that measuring a deep value cannot itself recurse."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, dict | list):
            continue
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def decode(frame: str | bytes, mode: str, max_frame_bytes: int) -> Any:
    """The frame's value, or Undecodable."""
    # The common case first: a JSON text frame of at most max_frame_bytes / 4 code points cannot
    # exceed max_frame_bytes in UTF-8, so its size needs no encoding (as seqfeed/1's decoder).
    if type(frame) is str and mode == "json" and len(frame) * 4 <= max_frame_bytes:
        return _json(frame, frame)
    if not isinstance(frame, str | bytes):  # the session's bug, but never a crash
        return Undecodable(repr(frame)[:_SNIPPET], "text", "frame is neither text nor bytes")
    size = len(frame) if isinstance(frame, bytes) else _utf8_len(frame)
    if size > max_frame_bytes:
        return raw(
            frame,
            f"frame of {size} bytes exceeds max_frame_bytes {max_frame_bytes}",
            limit=RAW_OVERSIZED_CHARS,
        )
    if mode == "binary_base64":
        data = frame if isinstance(frame, bytes) else frame.encode("utf-8", "surrogatepass")
        return base64.b64encode(data).decode("ascii")
    if isinstance(frame, bytes):
        if mode == "text":
            return raw(frame, f"binary frame of {size} bytes where text was expected")
        try:
            text = frame.decode("utf-8")
        except UnicodeDecodeError as exc:
            return raw(frame, f"binary frame is not UTF-8 ({exc.reason} at byte {exc.start})")
    else:
        text = frame
    if mode == "text":
        return text
    return _json(text, frame)


def _json(text: str, frame: str | bytes) -> Any:
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        return raw(frame, "JSON nested too deeply to parse")
    except Exception as exc:  # any parse failure is the upstream's, never the session's
        return raw(frame, f"not strict JSON ({exc.__class__.__name__}: {exc})")
    # A frame with few brackets cannot be deep: only count levels when it might be.
    if text.count("[") + text.count("{") > MAX_NESTING_DEPTH and nested_deeper_than(value, MAX_NESTING_DEPTH):
        return raw(frame, f"JSON nested deeper than {MAX_NESTING_DEPTH} levels")
    return value
