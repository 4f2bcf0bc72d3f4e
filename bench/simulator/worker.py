"""One simulated worker: the loops of worker/app.py, simplified, around the real lease code.

Real: the stores (ConnectionStore, SessionHeldStore, SessionStore, CheckpointStore) over the
in-memory client, the `Ownership` implementations (ConnectionLeases, SessionLeases), the
session validity (liveness.SessionValidity), the Lease model, and the reconcile's decisions
(lease/rebalance.py: the share, the room, the over-share claim, what to shed). Modelled, after
worker/: the acquirer's reconcile loop (acquirer.py, without its rendezvous ranking), the
keeper's per-lease renewal schedule (keeper.py), checkpoint rounds (checkpointer.py) and the
heartbeat (heartbeat.py); the peer watch is in peers.py. Not modelled: upstream sockets (every
connection delivers something every checkpoint period), SQS hints, store errors and latency
(every call answers at once), shutdown (workers only die or join).
"""

from __future__ import annotations

import asyncio
import collections
import math
import random
from dataclasses import dataclass

from bench.simulator import bulk
from bench.simulator.memory_dynamodb import MemoryDynamoDB, Meter
from bench.simulator.memory_table import Database
from bench.simulator.peers import PeerWatch
from leaseworker.lease.balance import FleetView
from leaseworker.lease.checkpoint_store import CheckpointStore
from leaseworker.lease.connection_store import ConnectionStore
from leaseworker.lease.dynamodb import now_ms
from leaseworker.lease.held_store import SessionHeldStore
from leaseworker.lease.liveness import SessionValidity
from leaseworker.lease.model import Lease, LeaseState, renewal_timeout
from leaseworker.lease.ownership import ConnectionLeases, Ownership, Progress
from leaseworker.lease.rebalance import newest_settled, over_share_room, plan_share, room
from leaseworker.lease.results import Acquired, AcquireResult, Lost, Stopped
from leaseworker.lease.session_leases import SessionLeases
from leaseworker.lease.session_store import Fenced, SessionStore
from leaseworker.settings import Settings
from leaseworker.worker.acquirer import LEAST_CANDIDATES, RECONCILE_JITTER
from leaseworker.worker.heartbeat import CLAIM_PUBLISH_SECONDS


@dataclass(slots=True)
class Held:
    lease: Lease
    acquired_at: float
    checkpointed_seq: int


class SimWorker:
    def __init__(
        self, settings: Settings, database: Database, rng: random.Random, *, fidelity: str = "exact"
    ) -> None:
        self.settings = settings
        self.me = settings.worker_id
        self.rng = rng
        self.fidelity = fidelity
        self.meter = Meter()
        self.client = MemoryDynamoDB(database, self.meter)
        client = self.client
        self.leases = ConnectionStore(client, settings)  # type: ignore[arg-type]
        self.held_store = SessionHeldStore(client, settings)  # type: ignore[arg-type]
        self.sessions = SessionStore(client, settings.table_name)  # type: ignore[arg-type]
        self.checkpoints = CheckpointStore(client, settings.table_name)  # type: ignore[arg-type]
        self.validity = SessionValidity(settings)
        self.ownership: Ownership = (
            SessionLeases(self.leases, self.held_store, self.checkpoints, self.validity, settings)
            if settings.lease_mode == "session"
            else ConnectionLeases(self.leases, self.held_store, settings)
        )
        self.held: dict[str, Held] = {}
        self.claiming: set[str] = set()
        self.peers = PeerWatch(self)
        self.target = settings.max_connections
        self.viewed_at = -math.inf
        self._previous_excess = 0
        self._unowned = 0
        self._live_peers = 0
        self._free_rounds = 0
        self._due: collections.deque[tuple[float, str]] = collections.deque()
        self._claimed = asyncio.Event()
        self._after_claims: asyncio.Task[None] | None = None
        self.fenced = False
        self.claims = 0  # successful claims (free or from the dead)
        self.releases = 0  # graceful hand-backs (rebalancing)

    # ------------------------------------------------------------------ life

    async def run(self) -> None:
        """The worker's loops, until cancelled (a death) or fenced."""
        await self.beat()
        if not self.fenced:
            await self.peers.round()
        try:
            await self._loops()
        finally:
            if self._after_claims is not None:
                self._after_claims.cancel()

    async def _loops(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._every(self.settings.heartbeat_seconds, self.beat))
            group.create_task(self._every(self.settings.heartbeat_seconds, self.peers.round))
            group.create_task(self._reconcile_loop())
            group.create_task(self._every(self.settings.checkpoint_seconds, self.checkpoint_round))
            if self.settings.lease_mode == "connection":
                group.create_task(self._keeper())

    async def _every(self, period: float, action: object) -> None:
        await asyncio.sleep(period * self.rng.random())  # workers do not start in lockstep
        while not self.fenced:
            await action()  # type: ignore[operator]
            await asyncio.sleep(period)

    def live_leases(self) -> list[Lease]:
        now = asyncio.get_running_loop().time()
        return [h.lease for h in self.held.values() if h.lease.is_valid(now)]

    # ------------------------------------------------------------------ heartbeat (heartbeat.py)

    async def beat(self) -> None:
        sent_at = asyncio.get_running_loop().time()
        result = await self.sessions.heartbeat(
            self.me,
            load=len(self.held),
            capacity=self.settings.max_connections,
            lease_mode=self.settings.lease_mode,
        )
        if isinstance(result, Fenced):
            self.validity.fence()
            self.fenced = True
            self.held.clear()  # worker/app.py `_on_fenced`: drop everything at once
            return
        self.validity.heartbeat_succeeded(sent_at)
        if self.settings.lease_mode == "session":
            for held in self.held.values():
                held.lease.extend_to(self.validity.valid_until)
        self._forget_invalid()

    def _forget_invalid(self) -> None:
        now = asyncio.get_running_loop().time()
        for cid in [cid for cid, h in self.held.items() if not h.lease.is_valid(now)]:
            del self.held[cid]

    # ------------------------------------------------------------------ acquirer (acquirer.py)

    async def _reconcile_loop(self) -> None:
        period = self.settings.reconcile_seconds
        await asyncio.sleep(period * self.rng.random())
        while not self.fenced:
            await self.reconcile()
            await asyncio.sleep(period * self.rng.uniform(1 - RECONCILE_JITTER, 1 + RECONCILE_JITTER))

    async def reconcile(self) -> None:
        self._forget_invalid()
        await self.refresh_share()
        for cid in await self.ownership.stopped_held():  # session mode's stop query (none here)
            if cid in self.held:
                await self._release(cid)
        capacity = self.capacity()
        free_rounds = self._free_rounds
        self._free_rounds = free_rounds + 1 if self._unowned > 0 else 0
        beyond = over_share_room(
            room_now=capacity,
            room_at_most=self.capacity(over_share=True),
            unowned=self._unowned,
            live_peers=self._live_peers,
            free_rounds=free_rounds,
        )
        over_share = beyond > 0
        if over_share:
            capacity = beyond
        while capacity > 0 and not self.fenced:  # batches until full or one wins nothing
            wanted = max(2 * capacity, LEAST_CANDIDATES)
            candidates = [c for c in await self.ownership.find_claimable(wanted) if not self.busy(c)]
            self.rng.shuffle(candidates)
            if over_share:
                candidates = candidates[:capacity]
            won = [isinstance(await self.claim(cid, over_share=over_share), Acquired) for cid in candidates]
            if not any(won) or over_share:
                return
            capacity = self.capacity()

    async def refresh_share(self, *, list_after_count: bool = True) -> None:
        free = await self.leases.count_free()
        if free and list_after_count:  # worker/app.py `_fleet_view`: count, then list
            await self.peers.list_now()
        orphaned = self.peers.orphaned
        self.viewed_at = asyncio.get_running_loop().time()
        view = FleetView(peers=tuple(self.peers.loads), free=free + orphaned, orphaned=orphaned)
        plan = plan_share(
            view,
            owned=len(self.held),
            claiming=len(self.claiming),
            my_capacity=self.settings.max_connections,
            previous_excess=self._previous_excess,
        )
        self.target = plan.target
        self._unowned = plan.unowned
        self._live_peers = plan.live_peers
        self._previous_excess = plan.excess
        if plan.shed:
            await self._shed(plan.shed)

    def capacity(self, *, over_share: bool = False) -> int:
        return room(
            max_connections=self.settings.max_connections,
            target=self.target,
            owned=len(self.held),
            claiming=len(self.claiming),
            over_share=over_share,
        )

    def busy(self, cid: str) -> bool:
        return cid in self.held or cid in self.claiming

    async def _shed(self, count: int) -> None:
        """The newest connections, each handed back gracefully: final checkpoint with the release."""
        newest = newest_settled(
            [(h.acquired_at, h) for h in self.held.values()],
            count,
            settled_before=asyncio.get_running_loop().time() - self.settings.heartbeat_seconds,
        )
        leaving = [self._let_go(held.lease.connection_id) for held in newest]
        if leaving:
            await self.beat()  # heartbeat.py `publish_load`: our load without them, first
        for held in leaving:
            await self._hand_back(held)
            self.releases += 1

    async def _release(self, cid: str) -> None:
        await self._hand_back(self._let_go(cid))

    def _let_go(self, cid: str) -> Held:
        """No longer our load: the heartbeat stops counting it (registry.held() in worker/)."""
        held = self.held.pop(cid)
        held.lease.state = LeaseState.RELEASING
        return held

    async def _hand_back(self, held: Held) -> None:
        await self.ownership.release(held.lease, self._delivered(held))

    async def claim(
        self, cid: str, *, over_share: bool = False, attempt: object = None
    ) -> AcquireResult | None:
        if self.busy(cid) or self.fenced or self.capacity(over_share=over_share) <= 0:
            return None
        self.claiming.add(cid)
        try:
            result: AcquireResult = await (attempt() if attempt else self.ownership.claim(cid))  # type: ignore[operator]
        finally:
            self.claiming.discard(cid)
        if isinstance(result, Acquired):
            now = asyncio.get_running_loop().time()
            self.held[cid] = Held(result.lease, now, result.lease.start_seq)
            self.claims += 1
            if self._after_claims is None or self._after_claims.done():  # heartbeat.py `publish_soon`
                self._after_claims = asyncio.get_running_loop().create_task(self._publish_after_claims())
            if self.settings.lease_mode == "connection":
                self._due.append((now + self.settings.heartbeat_seconds, cid))
                self._claimed.set()
        return result

    async def _publish_after_claims(self) -> None:
        await asyncio.sleep(CLAIM_PUBLISH_SECONDS)
        if not self.fenced:
            await self.beat()

    # ------------------------------------------------------------------ renewals (keeper.py)

    async def _keeper(self) -> None:
        period = self.settings.heartbeat_seconds
        loop = asyncio.get_running_loop()
        while not self.fenced:
            if not self._due:
                self._claimed.clear()
                await self._claimed.wait()
                continue
            wait = self._due[0][0] - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            now = loop.time()
            due: list[Lease] = []
            while self._due and self._due[0][0] <= now:
                _, cid = self._due.popleft()
                held = self.held.get(cid)
                if held is not None and held.lease.is_valid(now):
                    due.append(held.lease)
            await self._renew(due, now)
            for lease in due:
                if lease.connection_id in self.held:
                    self._due.append((now + period, lease.connection_id))

    async def _renew(self, due: list[Lease], sent_at: float) -> None:
        real = due
        if self.fidelity == "batched" and len(due) > 1:
            rest = bulk.renew_rest(
                self.client,
                self.settings.table_name,
                due[1:],
                now_ms() + int(self.settings.lease_seconds * 1000),
            )
            for lease in due[1:]:
                lease.renewed(sent_at, self.settings)
            real = [due[0], *rest]
        for lease in real:
            result = await self.ownership.renew(lease, timeout=renewal_timeout(self.settings))
            if isinstance(result, Lost):
                lease.lose(result.reason)
                self.held.pop(lease.connection_id, None)
            elif isinstance(result, Stopped):
                await self._release(lease.connection_id)
            else:
                lease.renewed(sent_at, self.settings)

    # ------------------------------------------------------------------ checkpoints (checkpointer.py)

    def _delivered(self, held: Held) -> int:
        """Modelled upstream: every connection delivered something since the last checkpoint."""
        return max(held.checkpointed_seq + 1, int(asyncio.get_running_loop().time() * 1000))

    async def checkpoint_round(self) -> None:
        now = asyncio.get_running_loop().time()
        entries = [(h, self._delivered(h)) for h in self.held.values() if h.lease.is_valid(now)]
        if not entries:
            return
        progress = [Progress(h.lease, seq, h.checkpointed_seq) for h, seq in entries]
        if self.settings.lease_mode == "session":
            result = await self.ownership.checkpoint_round(progress)
            recorded, lost = set(result.recorded), set(result.lost)
        else:
            recorded, lost = await self._checkpoint_leases(progress)
        for held, seq in entries:
            cid = held.lease.connection_id
            if cid in recorded:
                held.checkpointed_seq = seq
            elif cid in lost:
                self.held.pop(cid, None)

    async def _checkpoint_leases(self, progress: list[Progress]) -> tuple[set[str], set[str]]:
        real = progress
        if self.fidelity == "batched" and len(progress) > 1:
            pairs = [(p.lease, p.delivered_seq) for p in progress[1:]]
            refused = {
                lease.connection_id
                for lease in bulk.checkpoint_rest(self.client, self.settings.table_name, pairs, now_ms())
            }
            real = [progress[0], *(p for p in progress[1:] if p.lease.connection_id in refused)]
        recorded = {p.lease.connection_id for p in progress} - {p.lease.connection_id for p in real}
        lost: set[str] = set()
        for entry in real:
            result = await self.ownership.checkpoint_round([entry])
            recorded |= result.recorded
            lost |= result.lost
        return recorded, lost
