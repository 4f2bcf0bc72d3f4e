"""The simulated worker's peer watch: worker/peers.py's round, around the real pure decisions.

Real: the session listing, fences and `owned_by` (SessionStore, SessionHeldStore), checkpoint
reads, the observer (liveness.Observer, live_worker_ids), rendezvous ranking (rendezvous.rank,
claim_delay's rule) and the claim itself (`Ownership.claim_from_dead`). Modelled: one task per
takeover sweep instead of one per connection (the same claims at the same instants), no SQS
hand-on of a connection we have no room for, and ranks shared between workers through a cache
(every worker computes the same ranking; computing it once keeps 90 survivors × 10,000
connections × 90 hashes out of the run).
"""

from __future__ import annotations

import asyncio
import heapq
from typing import TYPE_CHECKING

from leaseworker.lease.balance import PeerLoad
from leaseworker.lease.checkpoint_store import resume_seq
from leaseworker.lease.dynamodb import now_ms
from leaseworker.lease.held_store import OwnedConnection
from leaseworker.lease.liveness import (
    CONFIRMED,
    SUSPECTED,
    Observer,
    PeerState,
    SessionInfo,
    Verdict,
    read_listing,
)
from leaseworker.lease.rendezvous import claim_delay, rank
from leaseworker.lease.results import AcquireResult
from leaseworker.worker.acquirer import SHARE_REFRESH_SECONDS
from leaseworker.worker.peers import (
    OVER_SHARE_AFTER_SECONDS,
    OVER_SHARE_RANKS,
    REAP_AFTER_LEASES,
    TAKEOVER_STEP_SECONDS,
)

if TYPE_CHECKING:
    from bench.simulator.worker import SimWorker

_RANKS: dict[tuple[str, tuple[str, ...]], list[str]] = {}


def shared_claim_delay(cid: str, me: str, live: list[str], step: float) -> float:
    """rendezvous.claim_delay, with the ranking of (connection, live workers) computed once."""
    if me not in live:
        return claim_delay(cid, me, live, step)
    key = (cid, tuple(live))
    order = _RANKS.get(key)
    if order is None:
        order = _RANKS[key] = rank(cid, live)
    return order.index(me) * step


class PeerWatch:
    def __init__(self, worker: SimWorker) -> None:
        self.worker = worker
        self.observer = Observer(worker.me, worker.settings.lease_seconds)
        self.loads: tuple[PeerLoad, ...] = ()
        self.live: list[str] = []
        self.fenced: dict[str, SessionInfo] = {}
        self._orphaned: dict[str, int] = {}
        self._scheduled: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.fences = 0

    @property
    def orphaned(self) -> int:
        return sum(self._orphaned.values())

    async def round(self) -> None:
        w = self.worker
        verdicts = await self.list_now()
        for verdict in verdicts:
            if verdict.worker_id == w.me:
                continue
            if verdict.state is PeerState.DEAD and await w.sessions.fence(
                verdict.worker_id, seen_hb=verdict.hb, me=w.me, kind=SUSPECTED, reason="silent"
            ):
                self.fences += 1
                await self._take_over(verdict.worker_id, SUSPECTED, now_ms())
            elif verdict.worker_id in self.fenced:
                session = self.fenced[verdict.worker_id]
                kind = CONFIRMED if session.fence_kind == CONFIRMED else SUSPECTED
                await self._take_over(verdict.worker_id, kind, session.fenced_at_ms)

    async def list_now(self) -> list[Verdict]:
        """worker/peers.py `_list`: list and judge, fence nothing."""
        w = self.worker
        sessions = await w.sessions.list_sessions()
        verdicts = self.observer.observe(sessions, asyncio.get_running_loop().time())
        listing = read_listing(verdicts, me=w.me, fenced_before=self.fenced)
        self.fenced, self.loads, self.live = listing.fenced, listing.peers, listing.live
        return verdicts

    async def _take_over(self, dead: str, kind: str, fenced_at_ms: int | None) -> None:
        w = self.worker
        held = await w.held_store.owned_by(dead)
        if not held:
            self._orphaned.pop(dead, None)
            age_ms = now_ms() - (fenced_at_ms or now_ms())
            if age_ms >= REAP_AFTER_LEASES * w.settings.lease_seconds * 1000:
                await w.sessions.reap(dead)
            return
        confirmed = kind == CONFIRMED
        claimable = [c for c in held if c.started and (confirmed or c.session_held)]
        if self._orphaned.get(dead) != len(claimable):
            self._orphaned[dead] = len(claimable)
            await w.refresh_share(list_after_count=False)
        claimable = [
            c for c in claimable if not w.busy(c.connection_id) and c.connection_id not in self._scheduled
        ]
        if not claimable or w.fenced:
            return
        entries = await w.checkpoints.read(dead)
        plan = []
        for connection in claimable:
            delay = shared_claim_delay(connection.connection_id, w.me, self.live, TAKEOVER_STEP_SECONDS)
            plan.append(
                (
                    delay,
                    connection.connection_id,
                    connection,
                    resume_seq(entries, connection.connection_id, connection.epoch),
                )
            )
            self._scheduled.add(connection.connection_id)
        task = asyncio.get_running_loop().create_task(self._sweep(plan, dead, confirmed))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sweep(
        self, plan: list[tuple[float, str, OwnedConnection, int]], dead: str, confirmed: bool
    ) -> None:
        """worker/peers.py `_claim_later` for every connection of one sweep, in time order."""
        w = self.worker
        loop = asyncio.get_running_loop()
        start = loop.time()
        queue = [(delay, cid, False, connection, resume) for delay, cid, connection, resume in plan]
        heapq.heapify(queue)
        try:
            while queue and not w.fenced:
                at, cid, over_share, connection, resume = heapq.heappop(queue)
                if (wait := start + at - loop.time()) > 0:
                    await asyncio.sleep(wait)
                if not over_share and not await self._have_room():
                    if round(at / TAKEOVER_STEP_SECONDS) < OVER_SHARE_RANKS:
                        heapq.heappush(queue, (at + OVER_SHARE_AFTER_SECONDS, cid, True, connection, resume))
                        continue
                    self._scheduled.discard(cid)
                    continue

                async def attempt(c: OwnedConnection = connection, r: int = resume) -> AcquireResult:
                    return await w.ownership.claim_from_dead(c, dead=dead, resume_seq=r, confirmed=confirmed)

                await w.claim(cid, attempt=attempt, over_share=over_share)
                self._scheduled.discard(cid)
        finally:
            for item in queue:
                self._scheduled.discard(item[1])

    async def _have_room(self) -> bool:
        """acquirer.has_room (without the wait for claims in flight: claims here answer at once)."""
        w = self.worker
        if w.capacity() <= 0 and asyncio.get_running_loop().time() - w.viewed_at > SHARE_REFRESH_SECONDS:
            await w.refresh_share()
        return w.capacity() > 0

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()
