"""The worker: one root TaskGroup running the loops of DESIGN.md §3.

- acquire/reconcile: find claimable connections and claim them, up to MAX_CONNECTIONS;
- heartbeat: renew every held lease, concurrently, each under its own deadline;
- checkpoint: write the sink-acknowledged seq of each session, conditioned on owner and epoch;
- notifications: the SQS fast path (a hint; reconcile is the backstop);
- metrics: gauges and an EMF flush every METRICS_SECONDS;
- one session task per owned connection.

A signal only sets an Event. `run` turns it into the ordered, bounded shutdown of §3.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

from leaseworker.lease.balance import fair_share
from leaseworker.lease.errors import StoreError
from leaseworker.lease.model import LeaseState
from leaseworker.lease.ownership import Ownership
from leaseworker.lease.store import Acquired, Lost, Malformed, Renewed, Stopped, now_ms
from leaseworker.notify import Notifier
from leaseworker.observability.logging import get_logger, log_context
from leaseworker.observability.metrics import MetricName, run_metrics_loop
from leaseworker.worker.session import ConnectionSession, Outcome, SessionDeps, SessionResult

logger = get_logger(__name__)

CLAIM_CONCURRENCY = 16
PASS_ON_LIMIT = 3  # re-sends of one hint by one worker per window
PASS_ON_WINDOW_SECONDS = 10.0
PASS_ON_MEMORY = 10_000  # connection ids remembered for that bound
SHARE_REFRESH_SECONDS = 0.25  # at most this often outside reconcile, when a hint finds us full
SHUTDOWN_MARGIN_SECONDS = 2.0  # left of SHUTDOWN_GRACE_SECONDS for exit after the budget


@dataclass(slots=True)
class _Owned:
    session: ConnectionSession
    task: asyncio.Task[None] | None = None
    acquired_at: float = field(default_factory=time.monotonic)


class Worker:
    def __init__(
        self,
        *,
        ownership: Ownership,
        deps: SessionDeps,
        notifier: Notifier,
        notifications: Callable[[asyncio.Event], AsyncIterator[str]] | None = None,
    ) -> None:
        self._ownership = ownership
        self._deps = deps
        self._settings = deps.settings
        self._metrics = deps.metrics
        self._tracing = deps.tracing
        self._notifier = notifier
        self._notifications = notifications
        self._owned: dict[str, _Owned] = {}
        self._claiming: set[str] = set()
        self._stop_acquiring = asyncio.Event()  # shutdown step 1
        self._loops_done = asyncio.Event()  # heartbeat/checkpoint/metrics may end
        self._group: asyncio.TaskGroup | None = None
        self._loops: list[asyncio.Task[None]] = []
        self._target = self._settings.max_connections  # refined by each fleet view
        self._viewed_at = -math.inf
        self._passed_on: dict[str, list[float]] = {}

    @property
    def owned(self) -> list[str]:
        return sorted(self._owned)

    async def run(self, stop: asyncio.Event) -> None:
        me = self._settings.worker_id
        with log_context(worker_id=me):
            logger.info("worker starting", extra={"lease_mode": self._settings.lease_mode})
            async with asyncio.TaskGroup() as group:
                self._group = group
                await self._announce()  # peers count us before we claim anything
                loops = [
                    self._acquire_loop(),
                    self._heartbeat_loop(),
                    self._checkpoint_loop(),
                    run_metrics_loop(
                        self._metrics,
                        interval=self._settings.metrics_seconds,
                        stop=self._loops_done,
                        sample=self._sample,
                    ),
                ]
                if self._notifications is not None:
                    loops.append(self._notification_loop(self._notifications))
                self._loops = [group.create_task(loop) for loop in loops]
                await stop.wait()
                await self._shutdown()
            logger.info("worker stopped")

    # ------------------------------------------------------------------ shutdown

    async def _shutdown(self) -> None:
        """Stop acquiring; close sockets (1001); flush; checkpoint + release; notify; flush metrics."""
        started = time.monotonic()
        budget = max(1.0, self._settings.shutdown_grace_seconds - SHUTDOWN_MARGIN_SECONDS)
        logger.info("shutting down", extra={"connections": len(self._owned), "budget_s": budget})
        self._stop_acquiring.set()
        try:
            async with asyncio.timeout(budget):
                # Leave the fleet first, so that peers' fair share grows before our hints reach them.
                await self._withdraw()
                for owned in list(self._owned.values()):
                    owned.session.request_release("worker shutting down")
                # Each session closes with 1001, hands its last batch to the sink, then its
                # wrapper releases the lease with the final checkpoint and notifies peers.
                # A claim that was in flight is released (with a hint) as soon as it lands.
                while self._owned or self._claiming:
                    tasks = [owned.task for owned in self._owned.values() if owned.task is not None]
                    for owned in self._owned.values():
                        owned.session.request_release("worker shutting down")
                    await asyncio.wait(tasks or [asyncio.ensure_future(asyncio.sleep(0.05))])
        except TimeoutError:
            logger.error("shutdown budget exhausted; abandoning leases to expiry", extra={"budget_s": budget})
            for owned in list(self._owned.values()):
                if owned.task is not None:
                    owned.task.cancel()
        self._loops_done.set()
        # Nothing is held any more: the loops have nothing left to do, so they need not finish.
        for loop in self._loops:
            loop.cancel()
        self._metrics.set_gauge(MetricName.ActiveConnections, len(self._owned))
        self._metrics.flush()
        logger.info("shutdown complete", extra={"seconds": round(time.monotonic() - started, 3)})

    # ------------------------------------------------------------------ acquire / reconcile

    async def _acquire_loop(self) -> None:
        while not self._stop_acquiring.is_set():
            with (
                self._tracing.span("lease.reconcile", worker_id=self._settings.worker_id),
                _survive("reconcile"),
            ):
                await self._reconcile()
            await _wait_any(self._settings.reconcile_seconds, self._stop_acquiring)

    async def _refresh_share(self) -> None:
        """Recompute this worker's fair share; on a store error keep the previous one."""
        try:
            view = await self._ownership.fleet_view()
        except StoreError as error:
            self._metrics.count(MetricName.LeaseAcquireFailures)
            logger.warning("fleet view failed; keeping the previous share", extra={"error": str(error)})
            return
        self._viewed_at = time.monotonic()
        share = fair_share(
            owned=self._held_count(),
            claiming=len(self._claiming),
            live_workers=view.live_workers,
            started=view.started,
            max_connections=self._settings.max_connections,
        )
        self._target = share.target
        if share.shed:
            self._shed(share.shed)

    def _shed(self, count: int) -> None:
        """Hand back the most recently acquired connections: a graceful release each."""
        held = [o for o in self._owned.values() if o.session.lease.state is LeaseState.HELD]
        newest = sorted(held, key=lambda owned: owned.acquired_at, reverse=True)[:count]
        if newest:
            logger.info(
                "rebalancing: handing back connections", extra={"count": len(newest), "target": self._target}
            )
        for owned in newest:
            owned.session.request_release("rebalance: above fair share")

    async def _reconcile(self) -> None:
        await self._refresh_share()
        capacity = self._capacity()
        if capacity <= 0:
            return
        try:
            candidates = await self._ownership.find_claimable(capacity * 2)
        except StoreError as error:
            self._metrics.count(MetricName.LeaseAcquireFailures)
            logger.warning("reconcile query failed", extra={"error": str(error)})
            return
        candidates = [cid for cid in candidates if cid not in self._owned and cid not in self._claiming]
        if candidates:
            self._metrics.count(MetricName.OrphansSeen, len(candidates))
        random.shuffle(candidates)  # peers reconciling at once start on different items
        gate = asyncio.Semaphore(CLAIM_CONCURRENCY)

        async def claim(cid: str) -> None:
            async with gate:
                await self._claim(cid)

        await asyncio.gather(*(claim(cid) for cid in candidates))

    def _capacity(self) -> int:
        limit = min(self._settings.max_connections, self._target)
        return limit - len(self._owned) - len(self._claiming)

    def _held_count(self) -> int:
        """Leases we mean to keep: sessions already handing back do not count towards the share."""
        return sum(1 for owned in self._owned.values() if owned.session.lease.state is LeaseState.HELD)

    async def _claim(self, connection_id: str) -> None:
        if self._stop_acquiring.is_set() or self._capacity() <= 0 or connection_id in self._owned:
            return
        self._claiming.add(connection_id)
        try:
            with self._tracing.span("lease.acquire", connection_id=connection_id):
                result = await self._ownership.claim(connection_id)
        except StoreError as error:
            self._metrics.count(MetricName.LeaseAcquireFailures)
            logger.warning("acquire failed", extra={"connection_id": connection_id, "error": str(error)})
            return
        finally:
            self._claiming.discard(connection_id)
        if isinstance(result, Lost):
            self._metrics.count(MetricName.LeaseContention)
            return
        if isinstance(result, Malformed):
            self._metrics.count(MetricName.LeaseAcquireFailures)
            logger.error("malformed connection item marked failed", extra={"connection_id": connection_id})
            return
        assert isinstance(result, Acquired)
        if self._stop_acquiring.is_set():
            await self._release_quietly(result)
            return
        self._start_session(result)

    def _start_session(self, acquired: Acquired) -> None:
        lease = acquired.lease
        previous = acquired.previous
        self._metrics.count(MetricName.LeasesAcquired)
        how = "new"
        now = now_ms()
        if previous is not None and previous.lease_epoch > 0:
            if previous.lease_expires_at_ms > 0:
                # It expired: time since its last renewal started the lease it failed to renew.
                how = "takeover"
                last_renewal = previous.lease_expires_at_ms - int(self._settings.lease_seconds * 1000)
                self._metrics.observe(MetricName.TakeoverSeconds, max(0, now - last_renewal) / 1000)
            elif previous.updated_at_ms:
                how = "handoff"
                self._metrics.observe(MetricName.HandoffSeconds, max(0, now - previous.updated_at_ms) / 1000)
        logger.info(
            "lease acquired",
            extra={
                "connection_id": lease.connection_id,
                "epoch": lease.epoch,
                "how": how,
                "previous_owner": previous.lease_owner if previous else None,
                "after_seq": lease.start_seq,
            },
        )
        session = ConnectionSession(lease, self._deps, self._ownership.record_failure)
        owned = _Owned(session)
        self._owned[lease.connection_id] = owned
        assert self._group is not None
        owned.task = self._group.create_task(self._run_session(owned), name=f"session:{lease.connection_id}")

    async def _run_session(self, owned: _Owned) -> None:
        session = owned.session
        lease = session.lease
        with log_context(connection_id=lease.connection_id, epoch=lease.epoch):
            try:
                result = await session.run()
            except Exception as error:  # a bug must not take the other connections down
                logger.exception("session crashed")
                result = SessionResult(Outcome.RELEASE, f"session crashed: {error}")
            try:
                await self._settle(session, result)
            finally:
                self._owned.pop(lease.connection_id, None)

    async def _settle(self, session: ConnectionSession, result: SessionResult) -> None:
        lease = session.lease
        if result.outcome is Outcome.LOST:
            self._metrics.count(MetricName.LeasesLost)
            logger.warning(
                "lease lost", extra={"reason": result.reason, "delivered_seq": session.delivered_seq}
            )
            return
        try:
            if result.outcome is Outcome.FAILED:
                await self._ownership.mark_failed(lease, result.reason)
                logger.error("connection marked failed", extra={"reason": result.reason})
            else:
                with self._tracing.span("lease.checkpoint", connection_id=lease.connection_id, final=True):
                    released = await self._ownership.release(lease, session.delivered_seq)
                logger.info(
                    "lease released",
                    extra={"released": released, "last_seq": session.delivered_seq, "reason": result.reason},
                )
        except StoreError as error:
            logger.error("could not release; the lease will expire", extra={"error": str(error)})
            return
        await self._notifier.connection_changed(lease.connection_id)

    async def _release_quietly(self, acquired: Acquired) -> None:
        with contextlib.suppress(StoreError):
            await self._ownership.release(acquired.lease, None)
            await self._notifier.connection_changed(acquired.lease.connection_id)

    # ------------------------------------------------------------------ heartbeat

    async def _heartbeat_loop(self) -> None:
        period = self._settings.heartbeat_seconds
        next_at = time.monotonic() + period
        while not self._loops_done.is_set():
            await _wait_any(max(0.0, next_at - time.monotonic()), self._loops_done)
            next_at += period
            if self._loops_done.is_set():
                return
            next_at = max(next_at, time.monotonic())  # after a pause, do not fire a burst
            with _survive("heartbeat"):
                if self._stop_acquiring.is_set():  # withdrawn from the fleet: renew only
                    await self._renew_all()
                else:
                    await asyncio.gather(self._renew_all(), self._announce())

    async def _renew_all(self) -> None:
        held = {
            owned.session.lease.connection_id: owned.session
            for owned in self._owned.values()
            if owned.session.lease.state in (LeaseState.HELD, LeaseState.RELEASING)
        }
        if not held:
            return
        with self._tracing.span("lease.renew_batch", leases=len(held)):
            results = await self._ownership.renew([session.lease for session in held.values()])
        for lease, result in results:
            session = held[lease.connection_id]
            if isinstance(result, Renewed):
                continue
            if isinstance(result, Stopped):
                logger.info("connection stopped by operator", extra={"connection_id": lease.connection_id})
                session.request_release("desired_state STOPPED")
            elif isinstance(result, Lost):
                logger.warning(
                    "renewal refused; dropping the connection",
                    extra={"connection_id": lease.connection_id, "reason": result.reason},
                )
                session.lose(result.reason)
            else:
                logger.warning(
                    "renewal failed; keeping the local deadline",
                    extra={"connection_id": lease.connection_id, "error": str(result)},
                )

    async def _announce(self) -> None:
        try:
            await self._ownership.announce(load=len(self._owned))
        except StoreError as error:
            logger.warning("presence heartbeat failed", extra={"error": str(error)})

    async def _withdraw(self) -> None:
        try:
            async with asyncio.timeout(2.0):
                await self._ownership.withdraw()
        except (StoreError, TimeoutError) as error:
            logger.warning("could not withdraw presence; it will expire", extra={"error": str(error)})

    # ------------------------------------------------------------------ checkpoint

    async def _checkpoint_loop(self) -> None:
        while not self._loops_done.is_set():
            await _wait_any(self._settings.checkpoint_seconds, self._loops_done)
            if self._loops_done.is_set():
                return
            with _survive("checkpoint"):
                await self._checkpoint_all()

    async def _checkpoint_all(self) -> None:
        due = [
            owned.session
            for owned in self._owned.values()
            if owned.session.lease.state is LeaseState.HELD
            and owned.session.delivered_seq > owned.session.checkpointed_seq
        ]
        if not due:
            return

        async def one(session: ConnectionSession) -> None:
            seq = session.delivered_seq
            self._metrics.observe(MetricName.CheckpointLagSeq, seq - session.checkpointed_seq)
            try:
                with self._tracing.span(
                    "lease.checkpoint", connection_id=session.lease.connection_id, seq=seq
                ):
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

        await asyncio.gather(*(one(session) for session in due))

    # ------------------------------------------------------------------ notifications

    async def _notification_loop(self, source: Callable[[asyncio.Event], AsyncIterator[str]]) -> None:
        async for connection_id in source(self._stop_acquiring):
            await self._on_changed(connection_id)

    async def _on_changed(self, connection_id: str) -> None:
        owned = self._owned.get(connection_id)
        if owned is None:
            if self._stop_acquiring.is_set():
                await self._pass_on(connection_id)
                return
            # Added, started or released elsewhere: try it now rather than at the next reconcile.
            if self._capacity() <= 0 and time.monotonic() - self._viewed_at > SHARE_REFRESH_SECONDS:
                await self._refresh_share()  # a peer may just have left: our share may have grown
            if self._capacity() <= 0:
                await self._pass_on(connection_id)
                return
            await self._claim(connection_id)
            return
        try:
            item = await self._ownership.status(connection_id)
        except StoreError:
            return  # the heartbeat will find out
        session = owned.session
        if item is None or item.lease_epoch != session.lease.epoch or item.lease_owner != session.lease.owner:
            session.lose("connection removed or taken over")
        elif item.desired_state != "STARTED":
            session.request_release("desired_state STOPPED")

    async def _pass_on(self, connection_id: str) -> None:
        """Re-send a hint we cannot act on, so that a peer with room gets it.

        One shared queue hands each message to one consumer; without this, a hint that lands on
        a full worker waits for some peer's reconcile. Each worker passes a given connection on
        at most PASS_ON_LIMIT times per PASS_ON_WINDOW_SECONDS, so a fleet with no room at all
        stops bouncing it (reconcile remains the backstop).
        """
        now = time.monotonic()
        recent = [t for t in self._passed_on.get(connection_id, []) if now - t < PASS_ON_WINDOW_SECONDS]
        if len(recent) >= PASS_ON_LIMIT:
            self._passed_on[connection_id] = recent
            return
        self._passed_on[connection_id] = [*recent, now]
        if len(self._passed_on) > PASS_ON_MEMORY:
            self._passed_on = {
                k: v for k, v in self._passed_on.items() if now - v[-1] < PASS_ON_WINDOW_SECONDS
            }
        await self._notifier.connection_changed(connection_id)

    # ------------------------------------------------------------------ metrics

    def _sample(self) -> None:
        self._metrics.set_gauge(MetricName.ActiveConnections, len(self._owned))


@contextlib.contextmanager
def _survive(loop: str) -> Iterator[None]:
    """A bug in one iteration of a loop is logged, not allowed to take the worker down:
    the leases' local deadlines keep every lost write safe."""
    try:
        yield
    except Exception:
        logger.exception("unexpected error in a worker loop; continuing", extra={"loop": loop})


async def _wait_any(timeout: float, *events: asyncio.Event) -> None:
    """Sleep up to `timeout`, waking early when any event is set."""
    if any(event.is_set() for event in events):
        return
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
