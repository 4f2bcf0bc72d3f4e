"""The upstream protocol as an adapter (docs/design.md §4).

A protocol knows two things: which frames the worker sends right after connecting, and how to
turn each received frame into a `DataFrame` or an `ErrorFrame`. Decoders are Sans-I/O: they hold
the last accepted sequence number and never touch a socket, so the session loop owns all I/O and
the protocol rules can be tested table-driven. `seqfeed/1` is the reference adapter; a raw
pass-through (no resume) could be added behind the same interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

ProtocolErrorKind = Literal["gap", "bad_json", "too_deep", "binary", "oversized", "unexpected", "bad_frame"]


@dataclass(frozen=True, slots=True)
class DataFrame:
    """One upstream message, accepted in order."""

    seq: int
    data: Any


@dataclass(frozen=True, slots=True)
class ReplayedFrame:
    """A data frame at or below the last accepted seq: an overlapping replay, dropped and
    counted by the session, never delivered twice and never an error (docs/design.md §4.5)."""

    seq: int


@dataclass(frozen=True, slots=True)
class ErrorFrame:
    """The upstream refused or ended the subscription (e.g. code `stale_epoch`)."""

    code: str
    message: str


class ProtocolError(Exception):
    """A frame broke the protocol. The session logs it, counts it and resubscribes after the
    last delivered seq; it never crashes the worker (docs/design.md §4.5)."""

    def __init__(self, kind: ProtocolErrorKind, message: str) -> None:
        # One line, whatever the upstream sent: the message ends up in logs and `last_error`.
        one_line = " ".join(message.split())
        super().__init__(f"{kind}: {one_line}")
        self.kind: ProtocolErrorKind = kind
        self.message = one_line


class FrameDecoder(Protocol):
    @property
    def last_seq(self) -> int:
        """The highest sequence number accepted so far (the `after_seq` it started from if none)."""
        ...

    def decode(self, frame: str | bytes) -> DataFrame | ReplayedFrame | ErrorFrame:
        """Decode one frame; raise ProtocolError (and nothing else) if it breaks the protocol.
        Advances `last_seq` only when it returns a DataFrame."""
        ...


class UpstreamProtocol(Protocol):
    name: str

    def opening_frames(self, *, connection_id: str, after_seq: int, epoch: int, worker_id: str) -> list[str]:
        """The frames the worker sends right after the socket opens, in order."""
        ...

    def decoder(self, after_seq: int) -> FrameDecoder:
        """A fresh decoder for one subscription that resumes after `after_seq`."""
        ...
