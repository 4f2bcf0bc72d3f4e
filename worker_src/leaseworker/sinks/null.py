"""`null`: accepts and discards every record, counting them (benchmarks, smoke tests)."""

from __future__ import annotations

from collections.abc import Sequence

from leaseworker.records import SinkRecord
from leaseworker.sinks.base import Validity, always_valid


class NullSink:
    writes_at_once = True  # sinks/base.py: write() never suspends

    def __init__(self) -> None:
        self.records = 0
        self.batches = 0

    async def write(self, records: Sequence[SinkRecord], *, valid: Validity = always_valid) -> None:
        self.records += len(records)
        self.batches += 1

    async def close(self) -> None:
        pass
