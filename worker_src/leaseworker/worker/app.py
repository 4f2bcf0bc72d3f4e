"""The worker: one root TaskGroup running the loops of docs/design.md §3.

- acquire/reconcile (`Acquirer`): claim free connections up to the fair share;
- renewals (`LeaseKeeper`, connection mode): every lease on its own schedule and deadline;
- the session heartbeat (`SessionHeartbeat`, both modes): our session item, every heartbeat;
- peers (`PeerWatch`): judge the other sessions, fence the silent, take over the fenced;
- checkpoints (`Checkpointer`): one conditional write per advanced session per round;
- notifications (`Hints`): the SQS fast path (a hint; reconcile is the backstop);
- metrics: gauges and an EMF flush every METRICS_SECONDS;
- one session task per owned connection.

A signal only sets an Event. `run` turns it into the ordered, bounded shutdown of §3
(`OrderedShutdown`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from leaseworker.lease.absent_owners import AbsentOwnerStore
from leaseworker.lease.balance import FleetView
from leaseworker.lease.checkpoint_store import CheckpointStore
from leaseworker.lease.connection_store import ConnectionStore
from leaseworker.lease.dynamodb import now_ms
from leaseworker.lease.held_store import SessionHeldStore
from leaseworker.lease.liveness import SessionValidity
from leaseworker.lease.ownership import Ownership
from leaseworker.lease.results import Acquired
from leaseworker.lease.session_store import Fenced, SessionStore
from leaseworker.lease.vocabulary import SESSION_HELD
from leaseworker.notify import Notifier
from leaseworker.observability.logging import get_logger, log_context
from leaseworker.observability.metrics import MetricName, run_metrics_loop
from leaseworker.worker.absent_owners import AbsentOwners
from leaseworker.worker.acquirer import Acquirer
from leaseworker.worker.audit import Audit
from leaseworker.worker.checkpointer import Checkpointer
from leaseworker.worker.endings import Outcome, SessionResult
from leaseworker.worker.fenced import WorkerFenced
from leaseworker.worker.heartbeat import SessionHeartbeat
from leaseworker.worker.hints import Hints, HintSource
from leaseworker.worker.keeper import LeaseKeeper
from leaseworker.worker.peers import PeerWatch
from leaseworker.worker.registry import Owned, Registry
from leaseworker.worker.relay import HintRelay
from leaseworker.worker.session import ConnectionSession
from leaseworker.worker.session_deps import SessionDeps
from leaseworker.worker.settle import Settler
from leaseworker.worker.shutdown import OrderedShutdown
from leaseworker.worker.waits import wait_any

logger = get_logger(__name__)

# How long the exit waits for sockets still closing in the background (upstream.BackgroundCloses),
# within the shutdown's margin for client teardown (SHUTDOWN_MARGIN_SECONDS, 2 s).
CLOSES_AT_EXIT_SECONDS = 1.0


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
        self._registry = Registry()
        self._stop_acquiring = asyncio.Event()  # shutdown step 1
        self._loops_done = asyncio.Event()  # renewals/heartbeats/checkpoints/metrics may end
        self._fenced_event = asyncio.Event()
        self._fenced: Fenced | None = None
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
            validity=coordination.validity,
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
        self._shutdown = OrderedShutdown(
            settings=self._settings,
            registry=self._registry,
            sessions=coordination.sessions,
            metrics=self._metrics,
            tracing_enabled=self._tracing.enabled,
            stop_acquiring=self._stop_acquiring,
            loops_done=self._loops_done,
            on_stopping=on_stopping,
            fenced=lambda: self._fenced is not None,
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
                await self._shutdown.run(self._hints_task)
                # Sockets closing in the background: the upstreams see our 1001, or an abort.
                await self._deps.closes.finish(CLOSES_AT_EXIT_SECONDS)
                # Nothing is held any more: the loops have nothing left to do, so they need not finish.
                for task in tasks:
                    task.cancel()
            logger.info("worker stopped")
        if self._fenced is not None:
            fenced = self._fenced
            raise WorkerFenced(fenced.fenced_by, fenced.kind, fenced.reason)

    def _on_fenced(self, fenced: Fenced) -> None:
        """Peers may be claiming our connections already: drop every one at once, deliver nothing."""
        extra = {"fenced_by": fenced.fenced_by, "kind": fenced.kind, "reason": fenced.reason}
        if self._shutdown.leaving:
            # Our own clean-exit fence (worker/shutdown.py), met by a last heartbeat on the wire:
            # the end of an ordered shutdown, not an alarm.
            logger.info("our session is closed by our own shutdown", extra=extra)
            return
        logger.error("our session is fenced: stopping at once", extra=extra)
        self._fenced = fenced
        for owned in list(self._registry.owned.values()):
            owned.session.lose(f"our session was fenced ({fenced.kind})")
        self._fenced_event.set()

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
        return FleetView(
            peers=self._peers.peers,
            free=free + orphaned,
            orphaned=orphaned,
            silent=self._peers.silent_load,
            unexpired=self._peers.unexpired,
        )

    # ------------------------------------------------------------------ metrics

    def _sample(self) -> None:
        self._metrics.set_gauge(MetricName.ActiveConnections, len(self._registry))
