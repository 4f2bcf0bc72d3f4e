"""Upstream protocols behind one interface (docs/design.md §4)."""

from leaseworker.protocol.base import (
    DataFrame,
    ErrorFrame,
    FrameDecoder,
    ProtocolError,
    ProtocolErrorKind,
    ReplayedFrame,
    UpstreamProtocol,
)
from leaseworker.protocol.seqfeed import (
    MAX_FRAME_BYTES,
    MAX_NESTING_DEPTH,
    STALE_EPOCH,
    SeqfeedDecoder,
    SeqfeedProtocol,
)

__all__ = [
    "MAX_FRAME_BYTES",
    "MAX_NESTING_DEPTH",
    "STALE_EPOCH",
    "DataFrame",
    "ErrorFrame",
    "FrameDecoder",
    "ProtocolError",
    "ProtocolErrorKind",
    "ReplayedFrame",
    "SeqfeedDecoder",
    "SeqfeedProtocol",
    "UpstreamProtocol",
]
