"""The worker's ordered, bounded shutdown (docs/design.md §3), after SIGTERM or a scale-in.

1. Stop acquiring, and withdraw our session: peers stop counting us while we release.
2. Ask every session to release: each closes its socket (1001), hands its last batch to the
   sink, and its wrapper releases the lease with the final checkpoint and sends a handoff hint.
   A claim in flight is released the same way as soon as it lands.
3. Let the hint loop's last long poll end by itself, and pass on what it brings.
4. Fence our own session as a confirmed (clean) exit, so that peers claim at once anything a
   failed release left behind.
5. Flush the metrics.

All of it within SHUTDOWN_GRACE_SECONDS less a margin for client teardown (and the tracing
flush); past that budget, the leases left are abandoned to expiry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from leaseworker.clock import monotonic
from leaseworker.lease.errors import StoreError
from leaseworker.lease.liveness import CONFIRMED
from leaseworker.lease.session_store import SessionStore
from leaseworker.observability.logging import get_logger
from leaseworker.observability.metrics import MetricName, WorkerMetrics
from leaseworker.observability.tracing import SHUTDOWN_TIMEOUT_SECONDS as TRACING_SHUTDOWN_SECONDS
from leaseworker.settings import Settings
from leaseworker.worker.registry import Registry

logger = get_logger(__name__)

SHUTDOWN_MARGIN_SECONDS = 2.0  # left of SHUTDOWN_GRACE_SECONDS for client teardown and exit
STEP_TIMEOUT_SECONDS = 2.0  # the withdrawal's and the final fence's own deadline


class OrderedShutdown:
    def __init__(
        self,
        *,
        settings: Settings,
        registry: Registry,
        sessions: SessionStore,
        metrics: WorkerMetrics,
        tracing_enabled: bool,
        stop_acquiring: asyncio.Event,
        loops_done: asyncio.Event,
        on_stopping: Callable[[], None] | None,
        fenced: Callable[[], bool],
    ) -> None:
        self._settings = settings
        self._registry = registry
        self._sessions = sessions
        self._metrics = metrics
        self._tracing_enabled = tracing_enabled
        self._stop_acquiring = stop_acquiring
        self._loops_done = loops_done  # renewals, heartbeats, checkpoints and metrics may end
        self._on_stopping = on_stopping
        self._fenced = fenced
        self.leaving = False  # our own clean-exit fence is being written

    async def run(self, hints_task: asyncio.Task[None] | None) -> None:
        """Stop acquiring; close sockets (1001); flush; checkpoint + release; notify; flush metrics."""
        started = monotonic()
        # After this budget: client teardown and, with tracing on, its bounded flush.
        margin = SHUTDOWN_MARGIN_SECONDS + (TRACING_SHUTDOWN_SECONDS if self._tracing_enabled else 0.0)
        budget = max(1.0, self._settings.shutdown_grace_seconds - margin)
        registry = self._registry
        logger.info("shutting down", extra={"connections": len(registry), "budget_s": budget})
        if self._on_stopping is not None:
            self._on_stopping()  # the container's health check says "not healthy" from now on
        self._stop_acquiring.set()
        try:
            async with asyncio.timeout(budget):
                # Leave the fleet (peers stop counting us) while the sockets close: the withdrawal
                # is one small write, a close handshake is longer, so it lands before our first
                # hint, and the handoff does not wait one more round trip for it.
                withdrawal = asyncio.create_task(self._withdraw())
                for owned in list(registry.owned.values()):
                    owned.session.request_release("worker shutting down")
                await withdrawal
                # Each session closes with 1001, hands its last batch to the sink, then its
                # wrapper releases the lease with the final checkpoint and notifies peers.
                # A claim that was in flight is released (with a hint) as soon as it lands.
                while registry.owned or registry.claiming:
                    for owned in list(registry.owned.values()):
                        owned.session.request_release("worker shutting down")
                    tasks = [owned.task for owned in registry.owned.values() if owned.task is not None]
                    if tasks:
                        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                    else:
                        await asyncio.sleep(0.02)  # only claims in flight: they end within their deadline
        except TimeoutError:
            logger.error("shutdown budget exhausted; abandoning leases to expiry", extra={"budget_s": budget})
            for owned in list(registry.owned.values()):
                if owned.task is not None:
                    owned.task.cancel()
        await self._drain_hints(hints_task, budget - (monotonic() - started))
        await self._leave()
        self._loops_done.set()
        self._metrics.set_gauge(MetricName.ActiveConnections, len(registry))
        self._metrics.flush()
        logger.info("shutdown complete", extra={"seconds": round(monotonic() - started, 3)})

    async def _withdraw(self) -> None:
        """Step 1: peers stop counting us; our session keeps beating while we release."""
        try:
            async with asyncio.timeout(STEP_TIMEOUT_SECONDS):
                await self._sessions.withdraw(self._settings.worker_id)
        except (StoreError, TimeoutError) as error:
            logger.warning("could not withdraw our session", extra={"error": str(error)})

    async def _drain_hints(self, hints_task: asyncio.Task[None] | None, within: float) -> None:
        """Let the hint loop's last long poll end by itself (it stops polling once we stop
        acquiring) and pass on what it brings. Every poller of the shared queue is a candidate
        for our own releases' hints; cancelled mid-poll, the hints it had received were lost to
        the queue's visibility timeout, and those connections waited for a reconcile (seen by
        the fault suite: a scale-in handoff of 1.88 s against L2's 1.5 s)."""
        if hints_task is None or within <= 0:
            return
        await asyncio.wait([hints_task], timeout=within)

    async def _leave(self) -> None:
        """Last: fence our own session as a confirmed (clean) exit, so that peers can claim at
        once anything a failed release left behind, and reap the item."""
        if self._fenced():
            return
        self.leaving = True
        me = self._settings.worker_id
        try:
            async with asyncio.timeout(STEP_TIMEOUT_SECONDS):
                await self._sessions.fence(
                    me, seen_hb=None, me=me, kind=CONFIRMED, reason="exited after its ordered shutdown"
                )
        except (StoreError, TimeoutError) as error:
            logger.warning("could not close our session; peers will fence it", extra={"error": str(error)})
