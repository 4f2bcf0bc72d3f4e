"""Event-stream frames of the atproto firehose: DAG-CBOR in, JSON-safe values out (and back).

Wire format (atproto.com/specs/event-stream, "Framing"): every binary WebSocket frame is two
DAG-CBOR objects, concatenated: a header `{op, t}` and a payload. `op` 1 is a message whose
Lexicon sub-type is `t` (`#commit`, `#identity`, `#account`, `#sync`, `#info`, …); `op` -1 is an
error, whose payload is `{error, message?}` and after which the server closes the stream.

Values become JSON by the atproto data model's JSON conventions (atproto.com/specs/data-model,
"JSON Representation"): a byte string is `{"$bytes": <base64>}` and a CID link (CBOR tag 42) is
`{"$link": <CID, base32 multibase>}`; everything else maps one to one. Anything outside the
DAG-CBOR data model (another tag, undefined, a simple value, a non-string map key, a float that
is not finite) is a FrameError, as is any framing or CBOR error. Nothing else is raised.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import cbor2

CID_TAG: Final = 42
# Nesting of arrays and maps, the value itself being 1. Firehose payloads are shallow (a commit's
# ops are 3 levels down); a record's JSON is not decoded here (it sits inside the CAR `blocks`).
MAX_DEPTH: Final = 128
_SNIPPET: Final = 120


class FrameError(ValueError):
    """A frame that is not a well-formed event-stream frame of DAG-CBOR."""


@dataclass(frozen=True, slots=True)
class Link:
    """A CID link (DAG-CBOR tag 42): the binary CID, without the tag's 0x00 multibase prefix."""

    cid: bytes

    def text(self) -> str:
        """The CID's string form: multibase base32 (lower case, unpadded), as atproto writes it."""
        return "b" + base64.b32encode(self.cid).decode("ascii").lower().rstrip("=")

    @classmethod
    def parse(cls, text: str) -> Link:
        """A CID string in base32 multibase (`b…`), the form `text()` writes."""
        if not text.startswith("b") or len(text) < 2:
            raise ValueError(f"not a base32 multibase CID: {text[:_SNIPPET]!r}")
        body = text[1:].upper()
        return cls(base64.b32decode(body + "=" * (-len(body) % 8)))


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded frame: the header's `op` and `t`, and the payload made JSON-safe."""

    op: int
    t: str | None
    body: Any


def _tag_hook(tag: cbor2.CBORTag, immutable: bool) -> Any:
    if tag.tag != CID_TAG:
        raise FrameError(f"CBOR tag {tag.tag} is not DAG-CBOR (only tag 42, a CID link)")
    value = tag.value
    if not isinstance(value, bytes) or len(value) < 2 or value[0] != 0:
        raise FrameError("tag 42 must hold a byte string: 0x00 then a binary CID")
    return Link(bytes(value[1:]))


def json_safe(value: Any) -> Any:
    """A decoded DAG-CBOR value as JSON-safe Python (the atproto data model's JSON form)."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise FrameError(f"float {value} has no strict JSON form")
        return value
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    if isinstance(value, Link):
        return {"$link": value.text()}
    if isinstance(value, list):
        return [json_safe(item) for item in value]
    if isinstance(value, dict):
        safe: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise FrameError(f"map key {str(key)[:_SNIPPET]!r} is not a string (DAG-CBOR keys are)")
            safe[key] = json_safe(item)
        return safe
    raise FrameError(f"a {type(value).__name__} is not in the DAG-CBOR data model")


def decode_frame(frame: bytes) -> Frame:
    """Header and payload of one binary frame; FrameError for anything else."""
    if not frame:
        raise FrameError("empty frame")
    stream = io.BytesIO(frame)
    decoder = cbor2.CBORDecoder(
        stream,
        tag_hook=_tag_hook,
        max_depth=MAX_DEPTH,
        allow_indefinite=False,  # DAG-CBOR: definite lengths only
        allow_duplicate_keys=False,
        str_errors="strict",
    )
    try:
        header = decoder.decode()
        position = stream.tell()
        if position >= len(frame):
            raise FrameError(f"a header of {position} bytes and no payload")
        body = decoder.decode()
    except FrameError:
        raise
    except RecursionError:
        raise FrameError(f"nested deeper than {MAX_DEPTH} levels") from None
    except Exception as error:  # whatever the decoder says about the bytes, it is the frame's fault
        if isinstance(error.__cause__, FrameError):  # our tag hook's refusal, wrapped by the decoder
            raise FrameError(str(error.__cause__)) from None
        raise FrameError(f"not DAG-CBOR ({type(error).__name__}: {error})"[:400]) from None
    if stream.tell() != len(frame):
        raise FrameError(f"{len(frame) - stream.tell()} bytes after the payload (a frame holds two objects)")
    if not isinstance(header, dict):
        raise FrameError(f"the header is a {type(header).__name__}, not a map")
    op = header.get("op")
    if not isinstance(op, int) or isinstance(op, bool):
        raise FrameError(f"the header's op is not an integer: {str(op)[:_SNIPPET]!r}")
    t = header.get("t")
    if t is not None and not isinstance(t, str):
        raise FrameError(f"the header's t is not a string: {str(t)[:_SNIPPET]!r}")
    if not isinstance(body, dict):
        raise FrameError(f"the payload is a {type(body).__name__}, not a map")
    return Frame(op=op, t=t, body=json_safe(body))


def _to_cbor(value: Any) -> Any:
    if isinstance(value, Link):
        return cbor2.CBORTag(CID_TAG, b"\x00" + value.cid)
    if isinstance(value, Mapping):
        return {key: _to_cbor(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_to_cbor(item) for item in value]
    return value


def encode_value(value: Any) -> bytes:
    """One DAG-CBOR object: canonical key order (length first, then bytes), Link as tag 42.

    For integers, strings, bytes, lists, maps, bools, None and Link: the firehose's payloads.
    (cbor2's canonical mode would shorten a float, which DAG-CBOR forbids: none is written here.)"""
    return cbor2.dumps(_to_cbor(value), canonical=True)


def encode_frame(header: Mapping[str, Any], body: Mapping[str, Any]) -> bytes:
    return encode_value(header) + encode_value(body)


def message_frame(t: str, body: Mapping[str, Any]) -> bytes:
    """An `op: 1` frame of sub-type `t` (e.g. `#commit`)."""
    return encode_frame({"op": 1, "t": t}, body)


def error_frame(error: str, message: str | None = None) -> bytes:
    """An `op: -1` frame: `{error, message?}`."""
    body: dict[str, Any] = {"error": error}
    if message is not None:
        body["message"] = message
    return encode_frame({"op": -1}, body)
