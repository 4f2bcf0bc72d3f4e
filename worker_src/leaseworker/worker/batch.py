"""A session's batch of records on their way to the sink, bounded in records and in bytes."""

from __future__ import annotations

from typing import Final

from leaseworker.clock import monotonic
from leaseworker.records import SinkRecord

BATCH_MAX_RECORDS: Final = 200
BATCH_MAX_BYTES: Final = 1024 * 1024  # about: each record is counted at its frame's size
BATCH_LINGER_SECONDS: Final = 0.02
RECORD_OVERHEAD_BYTES: Final = 160  # the envelope a record adds around its data (ids, seq, epoch, times)


def frame_size(frame: str) -> int:
    """The UTF-8 size of a text frame; O(1) for ASCII, which most frames are."""
    return len(frame) if frame.isascii() else len(frame.encode("utf-8", "surrogatepass"))


class Batch:
    """Records accepted in order, not yet handed to the sink.

    A record whose frame would take the batch past BATCH_MAX_BYTES waits for the next batch
    (`fits` says so), so a batch holds at most BATCH_MAX_BYTES, or one record larger than that.
    """

    def __init__(self) -> None:
        self.records: list[SinkRecord] = []
        self.size = 0
        self.first_at = 0.0

    def __len__(self) -> int:
        return len(self.records)

    def fits(self, frame_bytes: int) -> bool:
        return not self.records or self.size + frame_bytes + RECORD_OVERHEAD_BYTES <= BATCH_MAX_BYTES

    def add(self, record: SinkRecord, frame_bytes: int) -> None:
        if not self.records:
            self.first_at = monotonic()
        self.records.append(record)
        self.size += frame_bytes + RECORD_OVERHEAD_BYTES

    @property
    def full(self) -> bool:
        return len(self.records) >= BATCH_MAX_RECORDS or self.size >= BATCH_MAX_BYTES

    @property
    def linger_deadline(self) -> float:
        """When the batch's linger ends (monotonic); meaningful while it holds a record."""
        return self.first_at + BATCH_LINGER_SECONDS

    def linger_left(self) -> float:
        return self.linger_deadline - monotonic()

    def clear(self) -> None:
        self.records = []
        self.size = 0
