"""Checkpoint rounds (docs/design.md §3 step 4, §2b): every CHECKPOINT_SECONDS, when some session's
sink-acknowledged seq advanced. Connection mode writes each advanced lease's item (owner, epoch,
`last_seq < :seq`); session mode writes every held lease's (epoch, seq) in one checkpoint item.

One span per round, not one trace per connection (at 1,000 connections per task the latter is
about 200 traces/s). At most CHECKPOINT_CONCURRENCY writes are in flight, well below the lease
client's pool, so renewals never queue behind a round of checkpoints.
"""

from __future__ import annotations

import asyncio

from leaseworker.lease.ownership import Ownership, Progress, RoundResult
from leaseworker.observability.logging import get_logger
from leaseworker.observability.metrics import MetricName, WorkerMetrics
from leaseworker.observability.tracing import Tracing
from leaseworker.settings import Settings
from leaseworker.worker.loops import survive
from leaseworker.worker.registry import Registry
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
        live = self._registry.live()
        if self._settings.lease_mode == "session":
            # Session mode replaces the whole map, so every lease whose item still names us keeps
            # its entry until its release or hand-back lands: held, releasing (advanced or not; a
            # release that does not land must not leave the successor only the claim-time
            # last_seq: review 2026-12-05, C2) and lapsed. The entry is its only fresh checkpoint.
            live += self._registry.lapsed()
            progress = [
                Progress(
                    o.lease, o.session.delivered_seq, o.session.checkpointed_seq, o.session.delivered_cursor
                )
                for o in live
            ]
        else:
            progress = [
                Progress(
                    o.lease, o.session.delivered_seq, o.session.checkpointed_seq, o.session.delivered_cursor
                )
                for o in live
                if o.session.delivered_seq > o.session.checkpointed_seq
            ]
        session_mode = self._settings.lease_mode == "session"
        if not progress or not (session_mode or any(entry.advanced for entry in progress)):
            return  # session mode decides itself: it also refreshes its item's TTL (C3)
        for entry in progress:
            if entry.advanced:
                self._metrics.observe(
                    MetricName.CheckpointLagSeq, entry.delivered_seq - entry.checkpointed_seq
                )
        with self._tracing.span("lease.checkpoint_round", connections=len(progress)):
            if self._settings.lease_mode == "session":
                result = await self._ownership.checkpoint_round(progress)  # one batched write
            else:
                result = await self._per_lease(progress)
        sessions = {o.lease.connection_id: o.session for o in live}
        for entry in progress:
            cid = entry.lease.connection_id
            session = sessions[cid]
            if cid in result.recorded:
                session.checkpointed_seq = max(session.checkpointed_seq, entry.delivered_seq)
            elif cid in result.lost:
                session.lose("checkpoint refused: lease taken over")

    async def _per_lease(self, progress: list[Progress]) -> RoundResult:
        """Connection mode: one write per advanced lease, at most CHECKPOINT_CONCURRENCY at once."""
        results: list[RoundResult] = []

        async def one(entry: Progress) -> None:
            async with self._gate:
                results.append(await self._ownership.checkpoint_round([entry]))

        async with asyncio.TaskGroup() as group:
            for entry in progress:
                if entry.advanced:
                    group.create_task(one(entry))
        return RoundResult(
            frozenset().union(*(r.recorded for r in results)), frozenset().union(*(r.lost for r in results))
        )
