"""Watching the other workers' sessions (docs/design.md §2.0, §2b, §2e), in both lease modes.

Every HEARTBEAT_SECONDS: list the session items (O(workers) small reads), judge each peer on our
own monotonic clock (`liveness.Observer`), fence a peer whose counter stood still for
LEASE_SECONDS (a suspicion), and take over what fenced peers held:
- a suspected fence makes the peer's session-held connections claimable (their holder
  self-fenced on the same session deadline); its connection-mode leases still wait for expiry;
- a confirmed fence (the supervisor saw the process exit) makes everything it held claimable.

Claims are spread by rendezvous hashing over the live workers: the first choice claims at once,
the k-th after k × TAKEOVER_STEP_SECONDS, so a dead worker's load spreads evenly without a herd
and nothing waits on a full or slow first choice (a worker with no room passes the connection on
as a hint, so a peer with room claims it now). Fenced sessions are swept every round (a
delayed claim can land after a listing) and reaped once nothing is held by them and they have
been fenced for REAP_AFTER_LEASES lease periods (any write still in flight has landed by then).

The listing also feeds fair share: the live peers' published load and capacity.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from leaseworker.clock import monotonic
from leaseworker.lease.balance import PeerLoad
from leaseworker.lease.checkpoint_store import CheckpointStore, resume_seq
from leaseworker.lease.dynamodb import now_ms
from leaseworker.lease.errors import StoreError
from leaseworker.lease.held_reads import OwnedConnection
from leaseworker.lease.held_store import SessionHeldStore
from leaseworker.lease.liveness import (
    CONFIRMED,
    SUSPECTED,
    Observer,
    PeerState,
    SessionInfo,
    Verdict,
    read_listing,
    silent_after,
)
from leaseworker.lease.model import NO_CHECKPOINT
from leaseworker.lease.ownership import Ownership
from leaseworker.lease.rendezvous import claim_delay
from leaseworker.lease.results import AcquireResult
from leaseworker.lease.session_store import SessionStore
from leaseworker.observability.logging import get_logger
from leaseworker.observability.metrics import WorkerMetrics
from leaseworker.observability.tracing import Tracing
from leaseworker.settings import Settings
from leaseworker.worker.absent_owners import AbsentOwners
from leaseworker.worker.acquirer import Acquirer
from leaseworker.worker.loops import survive
from leaseworker.worker.registry import Registry
from leaseworker.worker.relay import HintRelay
from leaseworker.worker.waits import wait_any

logger = get_logger(__name__)

TAKEOVER_STEP_SECONDS = 0.25
HOLDER_CHECK_SECONDS = 1.0
REAP_AFTER_LEASES = 2
OVER_SHARE_RANKS = 2  # the first choices that claim a dead peer's connection beyond their share
OVER_SHARE_AFTER_SECONDS = 0.5  # after finding no room (room elsewhere would have claimed by then)
REFRESH_SECONDS = 0.25  # the least gap between listings a full worker's hints ask for
SETTLE_SECONDS = 1.0  # a takeover claim that finds us full waits this long for our claims in flight


@dataclass(frozen=True, slots=True)
class Takeover:
    connection: OwnedConnection
    dead: str
    resume_seq: int  # the dead holder's checkpoint entry at the connection's epoch, or -1
    confirmed: bool
    since_ms: int  # the death as best known, for TakeoverSeconds
    resume_cursor: str | None = None  # the cursor of that entry (JSON text), where it has one


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
        relay: HintRelay,
        absent: AbsentOwners,
    ) -> None:
        self._relay = relay
        self._absent = absent
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
        self._silent_after = silent_after(settings)  # out of the fair share, not yet fenced
        self._scheduled: set[str] = set()
        self._group: asyncio.TaskGroup | None = None
        self.peers: tuple[PeerLoad, ...] = ()
        self.silent_load = 0  # the load of live peers left out of `peers` as silent
        self._orphaned: dict[str, int] = {}  # fenced peer -> its claimable connections, last sweep
        self._unexpired: dict[str, int] = {}  # fenced peer -> its leases claimable once expired
        self._live: list[str] = []  # the live workers at the last listing, for rendezvous
        self._checked: dict[str, float] = {}  # holder -> when a hint last made us look
        self._listing = asyncio.Lock()
        self._listed_at = -math.inf
        self._fenced: dict[str, SessionInfo] = {}  # peers seen fenced, until their session is reaped
        self._empty_since: dict[str, float] = {}  # fenced peer -> monotonic first sight holding nothing

    @property
    def orphaned(self) -> int:
        """Connections held by fenced sessions, waiting to be claimed: they need owners too, and
        are neither any live worker's load nor free (fair share counts them)."""
        return sum(self._orphaned.values())

    @property
    def unexpired(self) -> int:
        """Connection-mode leases of peers fenced on suspicion, not expired yet: claimable once
        they expire, and meanwhile neither free nor any live worker's load (fair share counts
        them, so that the survivors' shares add up to every connection)."""
        return sum(self._unexpired.values())

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            self._group = group
            while not self._stop.is_set():
                with survive("peers"):
                    await self.round()
                await wait_any(self._settings.heartbeat_seconds, self._stop)

    async def refresh(self) -> bool:
        """List now rather than at our next heartbeat, for a hint that found us full: a peer may
        have just withdrawn (its load then no longer counts) or been fenced. At most once per
        REFRESH_SECONDS; True if it listed."""
        if self._group is None or self._stop.is_set():
            return False
        asked = monotonic()
        if asked - self._listed_at < REFRESH_SECONDS:
            return False
        async with self._listing:  # hints that ask at once share one listing
            if self._listed_at < asked:
                self._listed_at = monotonic()
                with survive("peers"):
                    await self._round()
        return True

    async def round(self) -> None:
        async with self._listing:  # one listing at a time: the observer sees them in order
            self._listed_at = monotonic()
            await self._round()

    async def list_now(self) -> None:
        """List the sessions now, for a fleet view whose free connections were just counted: a
        peer publishes its load before it releases (heartbeat.py), so a release the count saw
        is not also counted in that peer's load. Judges the peers but fences and takes over
        nothing (the rounds do). Raises StoreError."""
        async with self._listing:
            with self._tracing.span("session.peers"):
                await self._list()

    async def _round(self) -> None:
        with self._tracing.span("session.peers"):
            try:
                verdicts = await self._list()
            except StoreError as error:
                logger.warning("could not list sessions", extra={"error": str(error)})
                return
            for verdict in verdicts:
                if verdict.worker_id == self._me:
                    continue
                if verdict.state is PeerState.DEAD and await self._fence(verdict):
                    last_beat = verdict.session.updated_at_ms if verdict.session else now_ms()
                    await self._take_over(verdict.worker_id, SUSPECTED, last_beat, self._live)
                elif verdict.worker_id in self._fenced:
                    await self._take_over_fenced(verdict.worker_id, self._fenced[verdict.worker_id])
            listed = {verdict.worker_id for verdict in verdicts}
            await self._absent.sweep_if_due(listed=listed, live=self._live, now=monotonic())

    async def _list(self) -> list[Verdict]:
        """List and judge the sessions: the live peers' loads, the live workers, the fenced."""
        sessions = await self._sessions.list_sessions()
        verdicts = self._observer.observe(sessions, monotonic())  # the clock AFTER the read
        listing = read_listing(
            verdicts, me=self._me, fenced_before=self._fenced, silent_after=self._silent_after
        )
        self._fenced, self.peers, self._live = listing.fenced, listing.peers, listing.live
        self.silent_load = listing.silent_load
        return verdicts

    async def check_holder(self, holder: str, connection_id: str | None = None) -> bool:
        """A hint led us to `connection_id`, which `holder` still holds: if its session is fenced
        (the supervisor fences a dead child at once and then hints), drop it from our view (our
        share grows at once) and take over from it now rather than at our next listing. A holder
        not known fenced has its session read at most once per HOLDER_CHECK_SECONDS. True if
        `holder` is fenced (fences are never undone)."""
        if holder == self._me:
            return False
        session = self._fenced.get(holder)
        if session is None:
            now = monotonic()
            if now - self._checked.get(holder, -math.inf) < HOLDER_CHECK_SECONDS:
                return False
            self._checked[holder] = now
            try:
                session = await self._sessions.get(holder)
            except StoreError as error:
                extra = {"peer": holder, "error": str(error)}
                logger.warning("could not read a holder's session", extra=extra)
                return False
            if session is None or not session.fenced:
                return False
            self._fenced[holder] = session
            self.peers = tuple(peer for peer in self.peers if peer.worker_id != holder)
            self._live = [worker for worker in self._live if worker != holder]
        elif connection_id is None or connection_id in self._scheduled or self._registry.busy(connection_id):
            return True  # known fenced, and this connection is already being taken over
        # Else a takeover claim may have given up while our own hint's claim of the same id was
        # in flight (busy): sweep the holder again.
        if not self._stop.is_set():
            await self._take_over_fenced(holder, session)
        return True

    async def _take_over_fenced(self, dead: str, session: SessionInfo) -> None:
        if not self._absent.may_take_over(dead, session, monotonic()):
            return  # a stub for an absent session: L on our own clock first (absent_owners.py)
        kind = CONFIRMED if session.fence_kind == CONFIRMED else SUSPECTED
        # Takeover time counts from the death as best known: the confirmed fence follows the
        # exit within a second; a suspicion, the last heartbeat.
        since = session.fenced_at_ms if kind == CONFIRMED else session.updated_at_ms
        # claim_delay ranks us even when our own session is not listed yet.
        await self._take_over(dead, kind, since or now_ms(), self._live)

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

    async def _take_over(self, dead: str, kind: str, since_ms: int, live: list[str]) -> None:
        try:
            held = await self._held.owned_by(dead)
        except StoreError as error:
            logger.warning(
                "could not list a fenced peer's connections", extra={"peer": dead, "error": str(error)}
            )
            return
        if not held:
            self._orphaned.pop(dead, None)
            self._unexpired.pop(dead, None)
            await self._reap(dead)
            return
        self._empty_since.pop(dead, None)  # it holds something: the reap's wait starts again
        confirmed, now = kind == CONFIRMED, now_ms()
        waiting = [c for c in held if c.started and not (confirmed or c.session_held)]
        self._unexpired[dead] = sum(not c.lapsed(now, self._settings) for c in waiting)
        claimable = [c for c in held if c.started and (confirmed or c.session_held)]
        if self._orphaned.get(dead) != len(claimable):
            self._orphaned[dead] = len(claimable)
            # Our share grows before we claim our part. This runs inside a round (the listing
            # lock held, the listing just made) or for a hint that must not wait for one.
            await self._acquirer.refresh_share(list_after_count=False)
        # A STOPPED one nobody will claim: free it for `remove` once its holder serves nothing
        # (a connection-mode lease of a suspected peer only once it has expired: stopped while
        # its holder was cut off, it used to name that peer for good, and `remove` was refused).
        stopped = [
            c
            for c in held
            if not c.started and (confirmed or c.session_held or c.lapsed(now, self._settings))
        ]
        claimable = [c for c in claimable if not self._registry.busy(c.connection_id)]
        claimable = [c for c in claimable if c.connection_id not in self._scheduled]
        if not (stopped or claimable) or self._stop.is_set():
            return
        try:
            entries, cursors = await self._checkpoints.read_with_cursors(dead)
        except StoreError as error:
            logger.warning(
                "could not read a fenced peer's checkpoints", extra={"peer": dead, "error": str(error)}
            )
            return
        for connection in stopped:  # nobody will claim it: free it for `remove`, checkpoint kept
            resume = resume_seq(entries, connection.connection_id, connection.epoch)
            cursor = cursors.get(connection.connection_id) if resume > NO_CHECKPOINT else None
            await self._release_for(dead, connection, resume, cursor)
        if not claimable or self._group is None:
            # No group yet: the startup round (worker/app.py), which counts them in our share;
            # run()'s first round follows at once and schedules the claims.
            return
        for connection in claimable:
            delay = claim_delay(connection.connection_id, self._me, live, TAKEOVER_STEP_SECONDS)
            resume = resume_seq(entries, connection.connection_id, connection.epoch)
            cursor = cursors.get(connection.connection_id) if resume > NO_CHECKPOINT else None
            self._scheduled.add(connection.connection_id)
            claim = Takeover(connection, dead, resume, confirmed, since_ms, cursor)
            self._group.create_task(self._claim_later(claim, delay))

    async def _claim_later(self, takeover: Takeover, delay: float) -> None:
        connection = takeover.connection
        try:
            await wait_any(delay, self._stop)
            if self._stop.is_set():
                return
            over_share = False
            if not await self._have_room(connection.connection_id):
                # Every survivor may find itself full: each counts the others' published load,
                # which lags their takeover claims by up to a heartbeat (seen: targets 5 and 6
                # for 12 connections, and a 3.8 s takeover). So the first choices claim anyway,
                # within MAX_CONNECTIONS; rebalancing hands any excess back later, gracefully.
                rank = round(delay / TAKEOVER_STEP_SECONDS)
                if rank >= OVER_SHARE_RANKS:
                    return
                await wait_any(OVER_SHARE_AFTER_SECONDS, self._stop)
                if self._stop.is_set():
                    return
                over_share = True

            async def attempt() -> AcquireResult:
                return await self._ownership.claim_from_dead(
                    connection,
                    dead=takeover.dead,
                    resume_seq=takeover.resume_seq,
                    confirmed=takeover.confirmed,
                    resume_cursor=takeover.resume_cursor,
                )

            await self._acquirer.claim(
                connection.connection_id,
                attempt=attempt,
                takeover_since_ms=takeover.since_ms,
                over_share=over_share,
            )
        finally:
            self._scheduled.discard(connection.connection_id)

    async def _have_room(self, connection_id: str) -> bool:
        """Room to claim one more; if not, pass the connection on to a peer that may have it
        (hints reach one worker each, and the others would otherwise wait for their next
        listing: seen as an 11.8 s takeover on a 20 s lease)."""
        if await self._acquirer.has_room(wait_for_claims=SETTLE_SECONDS):
            return True
        if not self._registry.busy(connection_id):
            await self._relay.pass_on(connection_id)
        return False

    async def _release_for(
        self, dead: str, connection: OwnedConnection, resume: int, cursor: str | None
    ) -> None:
        try:
            await self._held.free_for(connection, dead=dead, resume_seq=resume, resume_cursor=cursor)
        except StoreError as error:
            logger.warning("could not free a fenced peer's stopped connection", extra={"error": str(error)})

    async def _reap(self, dead: str) -> None:
        """Reap a fenced session only once it has held nothing for REAP_AFTER_LEASES lease
        periods on OUR monotonic clock (two empty listings at least that far apart). Its
        `fenced_at_ms` came from another host's wall clock, and `owned_by` reads a lagging
        index: a claim of the dead worker's that lands (or is indexed) after the reap is held by
        a session that no longer exists (review 2026-12-05, D)."""
        now = monotonic()
        first_empty = self._empty_since.setdefault(dead, now)
        if now - first_empty < REAP_AFTER_LEASES * self._settings.lease_seconds:
            return
        try:
            if await self._sessions.reap(dead):
                self._absent.forget(dead)
                logger.info("reaped a fenced session that holds nothing", extra={"peer": dead})
        except StoreError as error:
            logger.warning("could not reap a fenced session", extra={"peer": dead, "error": str(error)})
