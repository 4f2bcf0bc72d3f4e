"""The simulation's sink: one arbiter of arrival order for every worker's deliveries (§2c S1)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from leaseworker.records import SinkRecord
from leaseworker.sinks.base import SinkError, Validity, always_valid


@dataclass(frozen=True, slots=True)
class Arrival:
    at: float  # virtual time
    worker_id: str
    connection_id: str
    epoch: int
    seq: int


@dataclass
class Arrivals:
    log: list[Arrival] = field(default_factory=list)


class RecordingSink:
    """Accepts a batch at once (it never suspends), after asking `valid` as a real sink must."""

    writes_at_once = True

    def __init__(self, arrivals: Arrivals, worker_id: str) -> None:
        self._arrivals = arrivals
        self._worker_id = worker_id
        self.cut = False  # a killed worker's writes never arrive

    async def write(self, records: Sequence[SinkRecord], *, valid: Validity = always_valid) -> None:
        if self.cut:
            raise SinkError("the worker is dead")
        if not valid():
            raise SinkError("the lease is gone: nothing sent")
        now = asyncio.get_running_loop().time()
        for record in records:
            self._arrivals.log.append(
                Arrival(now, record.worker_id, record.connection_id, record.epoch, record.seq)
            )

    async def close(self) -> None:
        return None
