"""The worker: one root TaskGroup running the loops of docs/design.md §3.

- acquire/reconcile (`Acquirer`): claim free connections up to the fair share;
- renewals (`LeaseKeeper`, connection mode): every lease on its own schedule and deadline;
- the session heartbeat (`SessionHeartbeat`, both modes): our session item, every heartbeat;
- peers (`PeerWatch`): judge the other sessions, fence the silent, take over the fenced;
- checkpoints (`Checkpointer`): one conditional write per advanced session per round;
- notifications (`Hints`): the SQS fast path (a hint; reconcile is the backstop);
- metrics: gauges and an EMF flush every METRICS_SECONDS;
- one session task per owned connection.

A signal only sets an Event. `run` turns it into the ordered, bounded shutdown of §3.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from leaseworker.clock import monotonic
from leaseworker.lease.absent_owners import AbsentOwnerStore
from leaseworker.lease.balance import FleetView
from leaseworker.lease.checkpoint_store import CheckpointStore
from leaseworker.lease.connection_store import ConnectionStore
from leaseworker.lease.dynamodb import now_ms
from leaseworker.lease.errors import StoreError
from leaseworker.lease.held_store import SessionHeldStore
from leaseworker.lease.liveness import CONFIRMED, SessionValidity
from leaseworker.lease.ownership import Ownership
from leaseworker.lease.results import Acquired
from leaseworker.lease.session_store import Fenced, SessionStore
from leaseworker.lease.vocabulary import SESSION_HELD
from leaseworker.notify import Notifier
from leaseworker.observability.logging import get_logger, log_context
from leaseworker.observability.metrics import MetricName, run_metrics_loop
from leaseworker.observability.tracing import SHUTDOWN_TIMEOUT_SECONDS as TRACING_SHUTDOWN_SECONDS
from leaseworker.worker.absent_owners import AbsentOwners
from leaseworker.worker.acquirer import Acquirer
from leaseworker.worker.audit import Audit
from leaseworker.worker.checkpointer import Checkpointer
from leaseworker.worker.fenced import WorkerFenced
from leaseworker.worker.heartbeat import SessionHeartbeat
from leaseworker.worker.hints import Hints, HintSource
from leaseworker.worker.keeper import LeaseKeeper
from leaseworker.worker.peers import PeerWatch
from leaseworker.worker.registry import Owned, Registry
from leaseworker.worker.relay import HintRelay
from leaseworker.worker.session import ConnectionSession, Outcome, SessionDeps, SessionResult
from leaseworker.worker.settle import Settler
from leaseworker.worker.waits import wait_any

logger = get_logger(__name__)

SHUTDOWN_MARGIN_SECONDS = 2.0  # left of SHUTDOWN_GRACE_SECONDS for client teardown and exit


@dataclass(frozen=True, slots=True)
class Coordination:
    """Everything the worker coordinates through: one store per item kind, and how it holds."""

    ownership: Ownership
    leases: ConnectionStore
    sessions: SessionStore
    held: SessionHeldStore
    checkpoints: CheckpointStore
    validity: SessionValidity
    absent: AbsentOwnerStore  # owners of held connections whose session item is gone (review D)


class Worker:
    def __init__(
        self,
        *,
        coordination: Coordination,
        deps: SessionDeps,
        notifier: Notifier,
        notifications: HintSource | None = None,
        on_heartbeat: Callable[[], None] | None = None,
        on_stopping: Callable[[], None] | None = None,
        task_arn: str | None = None,
    ) -> None:
        ownership = coordination.ownership
        self._coordination = coordination
        self._ownership = ownership
        self._deps = deps
        self._settings = deps.settings
        self._metrics = deps.metrics
        self._tracing = deps.tracing
        self._notifier = notifier
        self._notifications = notifications
        self._on_stopping = on_stopping
        self._registry = Registry()
        self._stop_acquiring = asyncio.Event()  # shutdown step 1
        self._loops_done = asyncio.Event()  # renewals/heartbeats/checkpoints/metrics may end
        self._fenced_event = asyncio.Event()
        self._fenced: Fenced | None = None
        self._leaving = False
        self._group: asyncio.TaskGroup | None = None
        self._hints_task: asyncio.Task[None] | None = None
        self._heartbeat = SessionHeartbeat(
            sessions=coordination.sessions,
            ownership=ownership,
            registry=self._registry,
            validity=coordination.validity,
            settings=self._settings,
            tracing=self._tracing,
            on_fenced=self._on_fenced,
            on_beat=on_heartbeat,
            task_arn=task_arn,
        )
        self._settler = Settler(
            ownership,
            deps,
            notifier,
            fenced=lambda: self._fenced is not None or coordination.validity.fenced,
            leaving=self._stop_acquiring.is_set,
            publish_load=self._heartbeat.publish_load,
        )
        parts = (ownership, self._registry, self._settings, self._metrics, self._tracing)
        self._acquirer = Acquirer(
            *parts,
            stop_acquiring=self._stop_acquiring,
            start=self._start_session,
            give_back=self._settler.give_back,
            fleet_view=self._fleet_view,
        )
        self._keeper = LeaseKeeper(*parts)
        self._checkpointer = Checkpointer(*parts)
        relay = HintRelay(notifier)
        self._peers = PeerWatch(
            sessions=coordination.sessions,
            held=coordination.held,
            checkpoints=coordination.checkpoints,
            ownership=ownership,
            registry=self._registry,
            acquirer=self._acquirer,
            settings=self._settings,
            metrics=self._metrics,
            tracing=self._tracing,
            stop_acquiring=self._stop_acquiring,
            relay=relay,
            absent=AbsentOwners(
                store=coordination.absent,
                sessions=coordination.sessions,
                me=self._settings.worker_id,
                lease_seconds=self._settings.lease_seconds,
                metrics=self._metrics,
            ),
        )
        self._audit = Audit(
            held=coordination.held,
            leases=coordination.leases,
            ownership=ownership,
            registry=self._registry,
            acquirer=self._acquirer,
            settings=self._settings,
            metrics=self._metrics,
            stop_acquiring=self._stop_acquiring,
        )
        self._hints = Hints(
            ownership=ownership,
            registry=self._registry,
            acquirer=self._acquirer,
            relay=relay,
            stop_acquiring=self._stop_acquiring,
            holder_check=self._peers.check_holder,
            refresh_peers=self._peers.refresh,
        )

    @property
    def owned(self) -> list[str]:
        return sorted(self._registry.owned)

    @property
    def peers(self) -> list[str]:
        """The live peers of our last listing (the ones our fair share counts)."""
        return [peer.worker_id for peer in self._peers.peers]

    @property
    def claiming(self) -> list[str]:
        """Claims in flight: their conditional write has been sent, no answer yet."""
        return sorted(self._registry.claiming)

    async def run(self, stop: asyncio.Event) -> None:
        me = self._settings.worker_id
        with log_context(worker_id=me):
            logger.info("worker starting", extra={"lease_mode": self._settings.lease_mode})
            async with asyncio.TaskGroup() as group:
                self._group = group
                # Our session first (peers count us, and in session mode it is what we hold
                # connections by), then one look at the peers, for a fair share from the start.
                await self._heartbeat.beat()
                if self._fenced is None:
                    await self._peers.round()
                loops = [
                    self._acquirer.run(),
                    self._heartbeat.run(self._loops_done),
                    self._peers.run(),
                    self._audit.run(),  # anti-entropy: what the table says we hold vs. what we serve
                    self._checkpointer.run(self._loops_done),
                    run_metrics_loop(
                        self._metrics,
                        interval=self._settings.metrics_seconds,
                        stop=self._loops_done,
                        sample=self._sample,
                    ),
                ]
                if self._ownership.renews_each_lease:
                    loops.append(self._keeper.run(self._loops_done))
                tasks = [group.create_task(loop) for loop in loops]
                if self._notifications is not None:
                    self._hints_task = group.create_task(self._hints.run(self._notifications))
                    tasks.append(self._hints_task)
                await wait_any(None, stop, self._fenced_event)
                await self._shutdown()
                # Nothing is held any more: the loops have nothing left to do, so they need not finish.
                for task in tasks:
                    task.cancel()
            logger.info("worker stopped")
        if self._fenced is not None:
            fenced = self._fenced
            raise WorkerFenced(fenced.fenced_by, fenced.kind, fenced.reason)

    def _on_fenced(self, fenced: Fenced) -> None:
        """Peers may be claiming our connections already: drop every one at once, deliver nothing."""
        if self._leaving:
            return  # our own clean-exit fence, seen by a last heartbeat
        self._fenced = fenced
        for owned in list(self._registry.owned.values()):
            owned.session.lose(f"our session was fenced ({fenced.kind})")
        self._fenced_event.set()

    # ------------------------------------------------------------------ shutdown

    async def _shutdown(self) -> None:
        """Stop acquiring; close sockets (1001); flush; checkpoint + release; notify; flush metrics."""
        started = monotonic()
        # After this budget: client teardown and, with tracing on, its bounded flush.
        margin = SHUTDOWN_MARGIN_SECONDS + (TRACING_SHUTDOWN_SECONDS if self._tracing.enabled else 0.0)
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
        await self._drain_hints(budget - (monotonic() - started))
        await self._leave()
        self._loops_done.set()
        self._metrics.set_gauge(MetricName.ActiveConnections, len(registry))
        self._metrics.flush()
        logger.info("shutdown complete", extra={"seconds": round(monotonic() - started, 3)})

    # ------------------------------------------------------------------ sessions

    def _start_session(self, acquired: Acquired, takeover_since_ms: int | None = None) -> None:
        lease = acquired.lease
        previous = acquired.previous
        self._metrics.count(MetricName.LeasesAcquired)
        how = "new"
        now = now_ms()
        if takeover_since_ms is not None:
            how = "takeover by fence"
            self._metrics.count(MetricName.TakeoversByFence)
            self._metrics.observe(MetricName.TakeoverSeconds, max(0, now - takeover_since_ms) / 1000)
        elif previous is not None and previous.lease_epoch > 0:
            if 0 < previous.lease_expires_at_ms < SESSION_HELD:
                # It expired: time since its last renewal started the lease it failed to renew.
                how = "takeover by expiry"
                self._metrics.count(MetricName.TakeoversByExpiry)
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
        owned = Owned(session)
        self._registry.add(owned)
        assert self._group is not None
        owned.task = self._group.create_task(self._run_session(owned), name=f"session:{lease.connection_id}")
        self._heartbeat.publish_soon()  # peers count it as our load from then on

    async def _run_session(self, owned: Owned) -> None:
        session = owned.session
        lease = session.lease
        with log_context(connection_id=lease.connection_id, epoch=lease.epoch):
            try:
                result = await session.run()
            except Exception as error:
                # A bug outside the session's own containment. Releasing would hand the same
                # bug to a peer at once (a hot bounce across the fleet): mark it failed instead,
                # with the reason, for an operator to look at and `connections start`.
                logger.exception("session crashed")
                result = SessionResult(Outcome.FAILED, f"session crashed: {type(error).__name__}: {error}")
            owned.settling = True  # the audit leaves it to the settler from here on
            try:
                await self._settler.settle(session, result)
            finally:
                self._registry.remove(lease.connection_id)

    # ------------------------------------------------------------------ the fleet

    async def _fleet_view(self, list_after_count: bool) -> FleetView:
        """The free connections counted, then the sessions listed: a peer publishes its load
        before it releases, so a release is counted once, as free or in neither (a listing from
        before the count would still hold it as the peer's load: seen as a connection bounced
        between workers for seconds). No free connection, no double count: the last listing
        serves, and the steady state costs no extra read."""
        free = await self._coordination.leases.count_free()
        if free and list_after_count:
            await self._peers.list_now()
        orphaned = self._peers.orphaned
        return FleetView(peers=self._peers.peers, free=free + orphaned, orphaned=orphaned)

    async def _withdraw(self) -> None:
        """Shutdown step 1: peers stop counting us; our session keeps beating while we release."""
        try:
            async with asyncio.timeout(2.0):
                await self._coordination.sessions.withdraw(self._settings.worker_id)
        except (StoreError, TimeoutError) as error:
            logger.warning("could not withdraw our session", extra={"error": str(error)})

    async def _drain_hints(self, within: float) -> None:
        """Let the hint loop's last long poll end by itself (it stops polling once we stop
        acquiring) and pass on what it brings. Every poller of the shared queue is a candidate
        for our own releases' hints; cancelled mid-poll, the hints it had received were lost to
        the queue's visibility timeout, and those connections waited for a reconcile (seen by
        the fault suite: a scale-in handoff of 1.88 s against L2's 1.5 s)."""
        if self._hints_task is None or within <= 0:
            return
        await asyncio.wait([self._hints_task], timeout=within)

    async def _leave(self) -> None:
        """Last: fence our own session as a confirmed (clean) exit, so that peers can claim at
        once anything a failed release left behind, and reap the item."""
        if self._fenced is not None:
            return
        self._leaving = True
        me = self._settings.worker_id
        try:
            async with asyncio.timeout(2.0):
                await self._coordination.sessions.fence(
                    me, seen_hb=None, me=me, kind=CONFIRMED, reason="exited after its ordered shutdown"
                )
        except (StoreError, TimeoutError) as error:
            logger.warning("could not close our session; peers will fence it", extra={"error": str(error)})

    # ------------------------------------------------------------------ metrics

    def _sample(self) -> None:
        self._metrics.set_gauge(MetricName.ActiveConnections, len(self._registry))
