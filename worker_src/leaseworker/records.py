"""The unit of delivery: one upstream message, stamped with who delivered it under which lease."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

# A str decoded from JSON may hold lone surrogates ("\ud800" is legal JSON text), which UTF-8
# cannot carry. Only they are escaped, so the rest of the line stays compact UTF-8.
_SURROGATE = re.compile("[\ud800-\udfff]")
# Built once: json.dumps with any option builds a new encoder per call (and JSONEncoder.encode a
# new C encoder), which cost about as much as encoding a small record. No circular check: a record's
# data was decoded from JSON text, which cannot be circular.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_C_ENCODE: Callable[[Any, int], Sequence[str]] | None = (
    None
    if c_make_encoder is None
    else c_make_encoder(None, _ENCODER.default, encode_basestring, None, ":", ",", False, False, False)
)


def _dumps(value: Any) -> str:
    return _ENCODER.encode(value) if _C_ENCODE is None else "".join(_C_ENCODE(value, 0))


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


@dataclass(frozen=True, slots=True)
class SinkRecord:
    """docs/design.md §5: `{connection_id, epoch, seq, cursor, kind, worker_id, received_at_ms, data}`,
    plus `key` where the feed's sequences are per key.

    `kind` is `data`, `gap` (a gap marker: `data` holds its reason and bounds) or `raw` (a frame
    that could not be decoded, delivered as it came). `cursor` is the upstream position after this
    record (a JSON value), or None."""

    connection_id: str
    seq: int
    epoch: int
    worker_id: str
    received_at_ms: int
    data: Any
    cursor: Any = None
    kind: str = "data"
    key: str | None = None

    def to_json(self) -> str:
        """Strict JSON (NaN/Infinity refused with ValueError) that always encodes as UTF-8, and
        decodes back to exactly what the upstream sent, lone surrogates included."""
        fields: dict[str, Any] = {
            "connection_id": self.connection_id,
            "epoch": self.epoch,
            "seq": self.seq,
            "cursor": self.cursor,
            "kind": self.kind,
            "worker_id": self.worker_id,
            "received_at_ms": self.received_at_ms,
            "data": self.data,
        }
        if self.key is not None:
            fields["key"] = self.key
        text = _dumps(fields)
        # A raw surrogate can only stand inside a JSON string, where its \u escape means the same.
        if text.isascii() or _SURROGATE.search(text) is None:
            return text
        return _SURROGATE.sub(_escape, text)
