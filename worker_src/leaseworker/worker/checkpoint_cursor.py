"""The checkpoint cursor a session keeps after each batched record: its JSON text, which must fit
one checkpoint entry (MAX_CURSOR_BYTES) for a feed that resumes from it."""

from __future__ import annotations

import json
from typing import Any

from leaseworker.lease.vocabulary import MAX_CURSOR_BYTES
from leaseworker.protocol.adapter import UpstreamProtocol

_CURSOR_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class CursorTooLarge(ValueError):
    """A resumable feed's checkpoint cursor that one checkpoint entry cannot hold."""


def checkpoint_text(checkpoint: Any, protocol: UpstreamProtocol | None) -> str | None:
    # An integer cursor (Jetstream time_us, a trade id) is the common case: no encoder needed
    # (P8 measured json.dumps with options at about 7 µs a record, most of generic/1's extra cost).
    text = str(checkpoint) if type(checkpoint) is int else _CURSOR_ENCODER.encode(checkpoint)
    if len(text.encode("utf-8", "surrogatepass")) <= MAX_CURSOR_BYTES:
        return text
    if protocol is None or protocol.resumable:
        raise CursorTooLarge(
            f"checkpoint cursor of {len(text)} bytes exceeds the {MAX_CURSOR_BYTES}-byte limit"
        )
    return None  # a feed that cannot replay: the cursor only bounds the next gap marker
