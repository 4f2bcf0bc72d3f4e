"""Checkpoint rounds (DESIGN.md §3 step 4): every CHECKPOINT_SECONDS, each session whose
sink-acknowledged seq advanced gets one conditional write (owner, epoch, and `last_seq < :seq`).

One span per round, not one trace per connection (at 1,000 connections per task the latter is
about 200 traces/s). At most CHECKPOINT_CONCURRENCY writes are in flight, well below the lease
client's pool, so renewals never queue behind a round of checkpoints.
"""

from __future__ import annotations

import asyncio

from leaseworker.lease.errors import StoreError
from leaseworker.lease.ownership import Ownership
from leaseworker.observability.logging import get_logger
from leaseworker.observability.metrics import MetricName, WorkerMetrics
from leaseworker.observability.tracing import Tracing
from leaseworker.settings import Settings
from leaseworker.worker.loops import survive
from leaseworker.worker.registry import Registry
from leaseworker.worker.session import ConnectionSession
from leaseworker.worker.waits import wait_any

logger = get_logger(__name__)

CHECKPOINT_CONCURRENCY = 16


class Checkpointer:
    def __init__(
        self,
        ownership: Ownership,
        registry: Registry,
        settings: Settings,
        metrics: WorkerMetrics,
        tracing: Tracing,
    ) -> None:
        self._ownership = ownership
        self._registry = registry
        self._settings = settings
        self._metrics = metrics
        self._tracing = tracing
        self._gate = asyncio.Semaphore(CHECKPOINT_CONCURRENCY)

    async def run(self, done: asyncio.Event) -> None:
        while not done.is_set():
            await wait_any(self._settings.checkpoint_seconds, done)
            if done.is_set():
                return
            with survive("checkpoint"):
                await self.round()

    async def round(self) -> None:
        due = [
            owned.session
            for owned in self._registry.held()
            if owned.session.delivered_seq > owned.session.checkpointed_seq
        ]
        if not due:
            return
        with self._tracing.span("lease.checkpoint_round", connections=len(due)):
            async with asyncio.TaskGroup() as group:
                for session in due:
                    group.create_task(self._one(session))

    async def _one(self, session: ConnectionSession) -> None:
        async with self._gate:
            seq = session.delivered_seq
            self._metrics.observe(MetricName.CheckpointLagSeq, seq - session.checkpointed_seq)
            try:
                ok = await self._ownership.checkpoint(session.lease, seq)
            except StoreError as error:
                logger.warning(
                    "checkpoint failed",
                    extra={"connection_id": session.lease.connection_id, "error": str(error)},
                )
                return
        if ok:
            session.checkpointed_seq = max(session.checkpointed_seq, seq)
        else:
            session.lose("checkpoint refused: lease taken over")
