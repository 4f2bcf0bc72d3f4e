"""Upstream protocols behind one interface (DESIGN.md §4)."""

from leaseworker.protocol.base import (
    DataFrame,
    ErrorFrame,
    FrameDecoder,
    ProtocolError,
    ProtocolErrorKind,
    UpstreamProtocol,
)
from leaseworker.protocol.seqfeed import MAX_FRAME_BYTES, STALE_EPOCH, SeqfeedDecoder, SeqfeedProtocol

__all__ = [
    "MAX_FRAME_BYTES",
    "STALE_EPOCH",
    "DataFrame",
    "ErrorFrame",
    "FrameDecoder",
    "ProtocolError",
    "ProtocolErrorKind",
    "SeqfeedDecoder",
    "SeqfeedProtocol",
    "UpstreamProtocol",
]
