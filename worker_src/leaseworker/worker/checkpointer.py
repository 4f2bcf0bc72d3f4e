"""Checkpoint rounds (docs/design.md §3 step 4, §2b): every CHECKPOINT_SECONDS, when some session's
sink-acknowledged seq advanced. Which leases a round writes, and how, is the Ownership's: connection
mode writes each advanced lease's item (owner, epoch, `last_seq < :seq`), at most
CHECKPOINT_CONCURRENCY at once; session mode writes every held lease's (epoch, seq) in one
checkpoint item.

Each session publishes an immutable snapshot of its progress (`ConnectionSession.progress`), and
this loop tells it what became durable (`checkpoint_recorded`) or that its lease is gone: it
writes none of the session's attributes.

One span per round, not one trace per connection (at 1,000 connections per task the latter is
about 200 traces/s).
"""

from __future__ import annotations

import asyncio

from leaseworker.lease.ownership import Ownership
from leaseworker.observability.logging import get_logger
from leaseworker.observability.metrics import MetricName, WorkerMetrics
from leaseworker.observability.tracing import Tracing
from leaseworker.settings import Settings
from leaseworker.worker.loops import survive
from leaseworker.worker.registry import Registry
from leaseworker.worker.waits import wait_any

logger = get_logger(__name__)


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

    async def run(self, done: asyncio.Event) -> None:
        while not done.is_set():
            await wait_any(self._settings.checkpoint_seconds, done)
            if done.is_set():
                return
            with survive("checkpoint"):
                await self.round()

    async def round(self) -> None:
        live = self._registry.live()
        lapsed = self._registry.lapsed()
        progress = self._ownership.checkpoint_scope(
            [o.session.progress for o in live], [o.session.progress for o in lapsed]
        )
        if not progress:
            return
        for entry in progress:
            if entry.advanced:
                self._metrics.observe(
                    MetricName.CheckpointLagSeq, entry.delivered_seq - entry.checkpointed_seq
                )
        with self._tracing.span("lease.checkpoint_round", connections=len(progress)):
            result = await self._ownership.checkpoint_round(progress)
        sessions = {o.lease.connection_id: o.session for o in (*live, *lapsed)}
        for entry in progress:
            cid = entry.lease.connection_id
            if cid in result.recorded:
                sessions[cid].checkpoint_recorded(entry.delivered_seq)
            elif cid in result.lost:
                sessions[cid].lose("checkpoint refused: lease taken over")
