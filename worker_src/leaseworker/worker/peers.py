"""Watching the other workers' sessions (DESIGN.md §2.0, §2b, §2e), in both lease modes.

Every HEARTBEAT_SECONDS: list the session items (O(workers) small reads), judge each peer on our
own monotonic clock (`liveness.Observer`), fence a peer whose counter stood still for
LEASE_SECONDS (a suspicion), and take over what fenced peers held:
- a suspected fence makes the peer's session-held connections claimable (their holder
  self-fenced on the same session deadline); its connection-mode leases still wait for expiry;
- a confirmed fence (the supervisor saw the process exit) makes everything it held claimable.

Claims are spread by rendezvous hashing over the live workers: the first choice claims at once,
the k-th after k × TAKEOVER_STEP_SECONDS, so a dead worker's load spreads evenly without a herd
and nothing waits on a full or slow first choice. Fenced sessions are swept every round (a
delayed claim can land after a listing) and reaped once nothing is held by them and they have
been fenced for REAP_AFTER_LEASES lease periods (any write still in flight has landed by then).

The listing also feeds fair share: the live peers' published load and capacity.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

from leaseworker.lease.balance import PeerLoad
from leaseworker.lease.checkpoint_store import CheckpointStore, resume_seq
from leaseworker.lease.errors import StoreError
from leaseworker.lease.held_store import OwnedConnection, SessionHeldStore
from leaseworker.lease.liveness import CONFIRMED, SUSPECTED, Observer, PeerState, Verdict, live_worker_ids
from leaseworker.lease.model import NO_CHECKPOINT, Lease
from leaseworker.lease.ownership import Ownership
from leaseworker.lease.rendezvous import claim_delay
from leaseworker.lease.session_store import SessionStore
from leaseworker.lease.store import AcquireResult, now_ms
from leaseworker.observability.logging import get_logger
from leaseworker.observability.metrics import WorkerMetrics
from leaseworker.observability.tracing import Tracing
from leaseworker.settings import Settings
from leaseworker.worker.acquirer import Acquirer
from leaseworker.worker.loops import survive
from leaseworker.worker.registry import Registry
from leaseworker.worker.waits import wait_any

logger = get_logger(__name__)

TAKEOVER_STEP_SECONDS = 0.25
HOLDER_CHECK_SECONDS = 1.0
REAP_AFTER_LEASES = 2


@dataclass(frozen=True, slots=True)
class Takeover:
    connection: OwnedConnection
    dead: str
    resume_seq: int  # the dead holder's checkpoint entry at the connection's epoch, or -1
    confirmed: bool
    since_ms: int  # the death as best known, for TakeoverSeconds


class PeerWatch:
    def __init__(
        self,
        *,
        sessions: SessionStore,
        held: SessionHeldStore,
        checkpoints: CheckpointStore,
        ownership: Ownership,
        registry: Registry,
        acquirer: Acquirer,
        settings: Settings,
        metrics: WorkerMetrics,
        tracing: Tracing,
        stop_acquiring: asyncio.Event,
    ) -> None:
        self._sessions = sessions
        self._held = held
        self._checkpoints = checkpoints
        self._ownership = ownership
        self._registry = registry
        self._acquirer = acquirer
        self._settings = settings
        self._metrics = metrics
        self._tracing = tracing
        self._stop = stop_acquiring
        self._me = settings.worker_id
        self._observer = Observer(self._me, settings.lease_seconds)
        self._scheduled: set[str] = set()
        self._group: asyncio.TaskGroup | None = None
        self.peers: tuple[PeerLoad, ...] = ()
        self._orphaned: dict[str, int] = {}  # fenced peer -> its claimable connections, last sweep
        self._live: list[str] = []  # the live workers at the last listing, for rendezvous
        self._checked: dict[str, float] = {}  # holder -> when a hint last made us look

    @property
    def orphaned(self) -> int:
        """Connections held by fenced sessions, waiting to be claimed: they need owners too, and
        are neither any live worker's load nor free (fair share counts them)."""
        return sum(self._orphaned.values())

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            self._group = group
            while not self._stop.is_set():
                with survive("peers"):
                    await self.round()
                await wait_any(self._settings.heartbeat_seconds, self._stop)

    async def round(self) -> None:
        with self._tracing.span("session.peers"):
            try:
                sessions = await self._sessions.list_sessions()
            except StoreError as error:
                logger.warning("could not list sessions", extra={"error": str(error)})
                return
            verdicts = self._observer.observe(sessions, time.monotonic())  # the clock AFTER the read
            self.peers = tuple(
                PeerLoad(v.worker_id, v.session.load, v.session.capacity)
                for v in verdicts
                if v.state is PeerState.LIVE and v.worker_id != self._me and v.session is not None
            )
            live = live_worker_ids(verdicts)
            self._live = live
            for verdict in verdicts:
                if verdict.worker_id == self._me:
                    continue
                if verdict.state is PeerState.DEAD and await self._fence(verdict):
                    last_beat = verdict.session.updated_at_ms if verdict.session else now_ms()
                    await self._take_over(
                        verdict.worker_id, SUSPECTED, last_beat, live, fenced_at_ms=now_ms()
                    )
                elif verdict.state is PeerState.FENCED and verdict.session is not None:
                    session = verdict.session
                    kind = CONFIRMED if session.fence_kind == CONFIRMED else SUSPECTED
                    # Takeover time counts from the death as best known: the confirmed fence
                    # follows the exit within a second; a suspicion, the last heartbeat.
                    since = session.fenced_at_ms if kind == CONFIRMED else session.updated_at_ms
                    await self._take_over(
                        verdict.worker_id, kind, since or now_ms(), live, fenced_at_ms=session.fenced_at_ms
                    )

    async def check_holder(self, holder: str) -> None:
        """A hint led us to a connection `holder` still holds: if its session is fenced (the
        supervisor fences a dead child at once and then hints), take over from it now rather
        than at our next listing. At most once per holder per HOLDER_CHECK_SECONDS."""
        now = time.monotonic()
        if holder == self._me or now - self._checked.get(holder, -math.inf) < HOLDER_CHECK_SECONDS:
            return
        self._checked[holder] = now
        try:
            session = await self._sessions.get(holder)
        except StoreError as error:
            logger.warning("could not read a holder's session", extra={"peer": holder, "error": str(error)})
            return
        if session is None or not session.fenced or self._stop.is_set():
            return
        kind = CONFIRMED if session.fence_kind == CONFIRMED else SUSPECTED
        since = session.fenced_at_ms if kind == CONFIRMED else session.updated_at_ms
        live = [*self._live] if self._me in self._live else [*self._live, self._me]
        await self._take_over(holder, kind, since or now_ms(), live, fenced_at_ms=session.fenced_at_ms)

    async def _fence(self, verdict: Verdict) -> bool:
        reason = f"hb {verdict.hb} unchanged for {verdict.still_for:.1f} s on {self._me}'s clock"
        try:
            fenced = await self._sessions.fence(
                verdict.worker_id, seen_hb=verdict.hb, me=self._me, kind=SUSPECTED, reason=reason
            )
        except StoreError as error:
            logger.warning(
                "could not fence a silent peer", extra={"peer": verdict.worker_id, "error": str(error)}
            )
            return False
        if fenced:
            logger.warning("fenced a silent peer", extra={"peer": verdict.worker_id, "reason": reason})
        return fenced

    async def _take_over(
        self, dead: str, kind: str, since_ms: int, live: list[str], *, fenced_at_ms: int | None
    ) -> None:
        try:
            held = await self._held.owned_by(dead)
        except StoreError as error:
            logger.warning(
                "could not list a fenced peer's connections", extra={"peer": dead, "error": str(error)}
            )
            return
        if not held:
            self._orphaned.pop(dead, None)
            await self._reap(dead, fenced_at_ms)
            return
        confirmed = kind == CONFIRMED
        claimable = [c for c in held if c.started and (confirmed or c.session_held)]
        if self._orphaned.get(dead) != len(claimable):
            self._orphaned[dead] = len(claimable)
            await self._acquirer.refresh_share()  # our share grows before we claim our part
        for stopped in (c for c in held if not c.started and (confirmed or c.session_held)):
            await self._release_for(dead, stopped)  # nobody will claim it: free it for `remove`
        claimable = [c for c in claimable if not self._registry.busy(c.connection_id)]
        claimable = [c for c in claimable if c.connection_id not in self._scheduled]
        if not claimable or self._stop.is_set():
            return
        try:
            entries = await self._checkpoints.read(dead)
        except StoreError as error:
            logger.warning(
                "could not read a fenced peer's checkpoints", extra={"peer": dead, "error": str(error)}
            )
            return
        assert self._group is not None
        for connection in claimable:
            delay = claim_delay(connection.connection_id, self._me, live, TAKEOVER_STEP_SECONDS)
            resume = resume_seq(entries, connection.connection_id, connection.epoch)
            self._scheduled.add(connection.connection_id)
            claim = Takeover(connection, dead, resume, confirmed, since_ms)
            self._group.create_task(self._claim_later(claim, delay))

    async def _claim_later(self, takeover: Takeover, delay: float) -> None:
        connection = takeover.connection
        try:
            await wait_any(delay, self._stop)
            if self._stop.is_set():
                return

            async def attempt() -> AcquireResult:
                return await self._ownership.claim_from_dead(
                    connection,
                    dead=takeover.dead,
                    resume_seq=takeover.resume_seq,
                    confirmed=takeover.confirmed,
                )

            await self._acquirer.claim(
                connection.connection_id, attempt=attempt, takeover_since_ms=takeover.since_ms
            )
        finally:
            self._scheduled.discard(connection.connection_id)

    async def _release_for(self, dead: str, connection: OwnedConnection) -> None:
        lease = Lease(connection.connection_id, connection.epoch, dead, "", NO_CHECKPOINT, 0.0)
        try:
            await self._ownership.release(lease, None)
        except StoreError as error:
            logger.warning("could not free a fenced peer's stopped connection", extra={"error": str(error)})

    async def _reap(self, dead: str, fenced_at_ms: int | None) -> None:
        age_ms = now_ms() - (fenced_at_ms or now_ms())
        if age_ms < REAP_AFTER_LEASES * self._settings.lease_seconds * 1000:
            return
        try:
            if await self._sessions.reap(dead):
                logger.info("reaped a fenced session that holds nothing", extra={"peer": dead})
        except StoreError as error:
            logger.warning("could not reap a fenced session", extra={"peer": dead, "error": str(error)})
