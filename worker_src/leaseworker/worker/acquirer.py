"""Acquire and reconcile (docs/design.md §2a/§2.0): claim free connections up to our fair share.

Every RECONCILE_SECONDS (± RECONCILE_JITTER, so that peers started together drift apart) the
acquirer refreshes this worker's fair share from the fleet view, hands back connections above it,
then claims free connections, at most CLAIM_CONCURRENCY at once, in batches until it is full or
a batch wins nothing.

Claims are partitioned by rendezvous hashing (lease/rendezvous.py) over this worker and the peers
that have room: each batch claims the candidates that rank us first, then, one CLAIM_STEP_SECONDS
later and only among what a new query still finds free, those that rank us second, then all
(RANK_STEPS). Every worker reads the same first candidates of the index, so without it peers
raced for the same items: a 10,000-connection cold start on 9 workers lost 22,412 conditional
writes for its 10,027 claims (2.2 per claim: 69 % of DynamoDB Local's writes were lost races,
docs/benchmarks.md P6). A worker that sees no peers claims everything at once, as before.

A claim is refused for an id already owned or being claimed. A claim whose reply was lost
(`AcquireUncertain`: DynamoDB may have applied it) is resolved by a read: if our write landed we
adopt the lease, otherwise nothing is ours; an applied claim is never left orphaned until expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from collections.abc import Awaitable, Callable

from leaseworker.clock import monotonic
from leaseworker.lease.balance import FleetView
from leaseworker.lease.errors import AcquireUncertain, StoreError
from leaseworker.lease.liveness import SessionValidity
from leaseworker.lease.ownership import Ownership
from leaseworker.lease.rebalance import newest_settled, over_share_room, plan_share, room
from leaseworker.lease.rendezvous import weight
from leaseworker.lease.results import Acquired, AcquireResult, Lost, Malformed
from leaseworker.observability.logging import get_logger
from leaseworker.observability.metrics import MetricName, WorkerMetrics
from leaseworker.observability.tracing import Tracing
from leaseworker.settings import Settings
from leaseworker.worker.loops import survive
from leaseworker.worker.registry import Registry
from leaseworker.worker.waits import wait_any

logger = get_logger(__name__)

CLAIM_CONCURRENCY = 32
# Candidates read per batch, however few we may claim: peers short of a few connections each all
# read the first items of the index, and with 2 × capacity candidates most of their claims lost
# to each other (the simulator's last 41 of a takeover waited for several reconciles).
LEAST_CANDIDATES = 64
RECONCILE_JITTER = 0.2  # each period is RECONCILE_SECONDS × uniform(0.8, 1.2)
RESOLVE_ATTEMPTS = 3
CLAIM_STEP_SECONDS = 0.25  # before claiming what ranks us next (as peers.TAKEOVER_STEP_SECONDS)
RANK_STEPS = 2  # ranks claimed one step apart; after RANK_STEPS steps, every rank
WINDOW_CLAIMERS = 4
SHARE_REFRESH_SECONDS = 0.25  # at most this often outside reconcile, when we find ourselves full


class Acquirer:
    def __init__(
        self,
        ownership: Ownership,
        registry: Registry,
        settings: Settings,
        metrics: WorkerMetrics,
        tracing: Tracing,
        *,
        stop_acquiring: asyncio.Event,
        start: Callable[[Acquired, int | None], None],
        fleet_view: Callable[[bool], Awaitable[FleetView]],
        give_back: Callable[[Acquired], Awaitable[None]],
        validity: SessionValidity | None = None,
    ) -> None:
        self._ownership = ownership
        self._validity = validity
        self._registry = registry
        self._settings = settings
        self._metrics = metrics
        self._tracing = tracing
        self._stop = stop_acquiring
        self._start = start
        self._fleet_view = fleet_view
        self._give_back = give_back
        self._gate = asyncio.Semaphore(CLAIM_CONCURRENCY)
        self._claim_settled = asyncio.Condition()
        self._refreshing = asyncio.Lock()  # concurrent hints share one refresh
        self.target = settings.max_connections  # refined by each fleet view
        self.viewed_at = -math.inf
        self._previous_excess = 0  # the last view's excess (lease/rebalance.py plan_share)
        self._unowned = 0  # free connections in the last fleet view that no peer has room for
        self._live_peers = 0
        self._claimers: tuple[str, ...] = ()  # peers with room in the last view: who claims now
        self._free_rounds = 0  # consecutive reconciles that saw free connections

    async def run(self) -> None:
        while not self._stop.is_set():
            with (
                self._tracing.span("lease.reconcile", worker_id=self._settings.worker_id),
                survive("reconcile"),
            ):
                await self.reconcile()
            period = self._settings.reconcile_seconds
            await wait_any(period * random.uniform(1 - RECONCILE_JITTER, 1 + RECONCILE_JITTER), self._stop)

    async def reconcile(self) -> None:
        await self.refresh_share()
        await self._release_stopped()
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
        # Claim in batches until full or a batch wins nothing: one query's candidates are shared
        # with the peers reconciling at once, and waiting a whole period for the next batch left
        # a cold start idle for seconds at a time (P6 in docs/benchmarks.md).
        reach = 0 if self._claimers and not over_share else RANK_STEPS
        while capacity > 0 and not self._stop.is_set():
            won = await self._claim_batch(capacity, over_share=over_share, reach=reach)
            if won is None:
                # Free connections, none ranking us within reach: their first choices may be
                # claiming them now (or be full). A step later, look again one rank further.
                # The share stays this reconcile's: a view taken while peers claim counts their
                # claims neither as free nor yet as their published load, and a target cut by
                # it ended the reconcile with the share unfilled (seen: P6 stalls of a period).
                reach += 1
                await wait_any(CLAIM_STEP_SECONDS, self._stop)
                continue
            if not won or over_share:
                return
            capacity = self.capacity()

    async def _claim_batch(self, capacity: int, *, over_share: bool, reach: int) -> int | None:
        """Claim up to `capacity` of the free connections that rank us within `reach` (from 0;
        RANK_STEPS or more: all); how many were acquired, None if some were free but none
        ranked us within reach."""
        claimers = (self._settings.worker_id, *self._claimers)
        try:
            # Reading capacity × claimers, about `capacity` of them rank us first (a window of
            # at most WINDOW_CLAIMERS shares: each batch reads the whole window again).
            wanted = capacity * min(len(claimers), WINDOW_CLAIMERS) if reach < RANK_STEPS else 0
            wanted = max(wanted, 2 * capacity)
            candidates = await self._ownership.find_claimable(max(wanted, LEAST_CANDIDATES))
        except StoreError as error:
            self._metrics.count(MetricName.LeaseAcquireFailures)
            logger.warning("reconcile query failed", extra={"error": str(error)})
            return 0
        candidates = [cid for cid in candidates if not self._registry.busy(cid)]
        if candidates:
            self._metrics.count(MetricName.OrphansSeen, len(candidates))
        random.shuffle(candidates)  # peers reconciling at once start on different items
        if reach < RANK_STEPS:
            within = [cid for cid in candidates if _rank_of_first(cid, claimers) <= reach]
            if candidates and not within:
                return None
            candidates = within
        return await self._claim_some(candidates, capacity, over_share=over_share)

    async def _claim_some(self, candidates: list[str], wanted: int, *, over_share: bool) -> int:
        """Claim up to `wanted` of `candidates`, at most `wanted` at a time: a claim lost to a
        peer hands its slot to the next candidate. Claiming them all at once, the first `wanted`
        took the room and the rest were refused it; when those lost their races, the free ones
        behind them waited a reconcile (seen in the simulation: a takeover's last connection at
        5.2 s against L1's 4.4 s, its one claim lost and the free one behind it never tried)."""
        pending = iter(candidates)

        async def slot() -> int:
            for connection_id in pending:
                result = await self.claim(connection_id, over_share=over_share)
                if isinstance(result, Acquired):
                    return 1
                if result is None and self.capacity(over_share=over_share) <= 0:
                    return 0  # the room went to a hint's claim meanwhile
            return 0

        async with asyncio.TaskGroup() as group:
            slots = [group.create_task(slot()) for _ in range(min(wanted, len(candidates)))]
        return sum(won.result() for won in slots)

    async def refresh_share(self, *, list_after_count: bool = True) -> None:
        """Recompute this worker's fair share; on a store error keep the previous one.
        `list_after_count`: list the sessions again after counting free connections (app.py
        `_fleet_view`); False only where a listing was just made and cannot be waited for."""
        started = monotonic()
        try:
            view = await self._fleet_view(list_after_count)
        except StoreError as error:
            self._metrics.count(MetricName.LeaseAcquireFailures)
            logger.warning("fleet view failed; keeping the previous share", extra={"error": str(error)})
            return
        self.viewed_at = started
        plan = plan_share(
            view,
            owned=len(self._registry.held()),
            claiming=len(self._registry.claiming),
            my_capacity=self._settings.max_connections,
            previous_excess=self._previous_excess,
        )
        self.target = plan.target
        self._unowned = plan.unowned
        self._claimers = plan.claimers
        self._live_peers = plan.live_peers
        self._previous_excess = plan.excess
        if plan.shed:
            self._shed(plan.shed)

    async def refresh_share_since(self, since: float) -> None:
        """Refresh unless a view begun at or after `since` (monotonic) is already in: of many
        hints that find us full at once, one reads the fleet and the others wait for it."""
        async with self._refreshing:
            if self.viewed_at < since:
                await self.refresh_share()

    async def _release_stopped(self) -> None:
        """Session mode: an operator's stop is noticed here (no per-connection renewal tells us)."""
        try:
            stopped = await self._ownership.stopped_held()
        except StoreError as error:
            logger.warning("could not query stopped connections", extra={"error": str(error)})
            return
        for connection_id in stopped:
            owned = self._registry.owned.get(connection_id)
            if owned is not None:
                owned.session.request_release("desired_state STOPPED")

    async def has_room(self, *, wait_for_claims: float = 0.0) -> bool:
        """Room to claim one more now. When full, look at the fleet again first (at most every
        SHARE_REFRESH_SECONDS): a peer may just have left, and our share grown with it. A full
        worker whose claims in flight hold the room waits up to `wait_for_claims` seconds for
        them to settle (most claims of a dead peer's connections by a hint fail at once)."""
        deadline = monotonic() + wait_for_claims
        while True:
            if self.capacity() <= 0 and monotonic() - self.viewed_at > SHARE_REFRESH_SECONDS:
                await self.refresh_share_since(monotonic() - SHARE_REFRESH_SECONDS)
            if self.capacity() > 0:
                return True
            remaining = deadline - monotonic()
            if remaining <= 0 or not self._registry.claiming:
                return False
            async with self._claim_settled:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await self._claim_settled.wait()

    def capacity(self, *, over_share: bool = False) -> int:
        """How many more we may claim: up to our fair share, or (`over_share`) up to our
        MAX_CONNECTIONS; none while our own session is past its deadline. Peers may be fencing
        us then, and a claim that lands meanwhile names a worker about to stop: the connection
        waits for its give-back or its expiry (the fault suite's ddb_stall: a worker cut off
        from DynamoDB re-claimed a connection it had just self-fenced, the claim landed as the
        stall ended, and the connection waited 11 s for an owner, against L1's 5.9 s)."""
        if self._validity is not None and not self._validity.is_valid(monotonic()):
            return 0
        return room(
            max_connections=self._settings.max_connections,
            target=self.target,
            owned=len(self._registry),
            claiming=len(self._registry.claiming),
            over_share=over_share,
        )

    def _shed(self, count: int) -> None:
        """Hand back the most recently acquired connections, a graceful release each, but none
        younger than a heartbeat: a connection just claimed in a takeover or a handoff, possibly
        above our share, has waited for an owner once already (L2), and its excess is shed later
        if it is real."""
        newest = newest_settled(
            [(owned.acquired_at, owned) for owned in self._registry.held()],
            count,
            settled_before=monotonic() - self._settings.heartbeat_seconds,
        )
        if newest:
            logger.info(
                "rebalancing: handing back connections", extra={"count": len(newest), "target": self.target}
            )
        for owned in newest:
            owned.session.request_release("rebalance: above fair share")

    async def claim(
        self,
        connection_id: str,
        *,
        attempt: Callable[[], Awaitable[AcquireResult]] | None = None,
        takeover_since_ms: int | None = None,
        over_share: bool = False,
    ) -> AcquireResult | None:
        """Claim one connection (free by default; `attempt` claims it another way, e.g. from a
        fenced peer). It counts as "claiming" until its session is registered or the lease is
        given back, so a shutdown that begins meanwhile waits for it (never orphaned).
        The write's result (Lost names the holder), or None when no claim was attempted."""
        if self._registry.busy(connection_id) or self._stop.is_set():
            return None
        if self.capacity(over_share=over_share) <= 0:
            return None
        self._registry.claiming.add(connection_id)  # counted by capacity() from here on
        try:
            async with self._gate:
                logger.debug("claim sent", connection_id=connection_id)  # bench/handoff_trace.py
                result = await self._attempt(connection_id, attempt)
            if not isinstance(result, Acquired):
                return result
            if self._stop.is_set():
                await self._give_back(result)
                return result
            self._start(result, takeover_since_ms)  # registered as owned before it stops being a claim
            return result
        finally:
            self._registry.claiming.discard(connection_id)
            async with self._claim_settled:
                self._claim_settled.notify_all()

    async def _attempt(
        self, connection_id: str, attempt: Callable[[], Awaitable[AcquireResult]] | None
    ) -> AcquireResult | None:
        try:
            with self._tracing.span("lease.acquire", connection_id=connection_id):
                result = await (attempt() if attempt is not None else self._ownership.claim(connection_id))
        except AcquireUncertain as uncertain:
            self._metrics.count(MetricName.LeaseAcquireFailures)
            logger.warning(
                "acquire reply lost; reading back",
                extra={"connection_id": connection_id, "error": str(uncertain)},
            )
            return await self._resolve(uncertain)
        except StoreError as error:
            self._metrics.count(MetricName.LeaseAcquireFailures)
            logger.warning("acquire failed", extra={"connection_id": connection_id, "error": str(error)})
            return None
        if isinstance(result, Lost):
            self._metrics.count(MetricName.LeaseContention)
        elif isinstance(result, Malformed):
            self._metrics.count(MetricName.LeaseAcquireFailures)
            logger.error("malformed connection item marked failed", extra={"connection_id": connection_id})
        return result

    async def _resolve(self, uncertain: AcquireUncertain) -> Acquired | None:
        for attempt in range(RESOLVE_ATTEMPTS):
            try:
                adopted = await self._ownership.resolve_uncertain(uncertain)
            except StoreError as error:
                logger.warning("could not read back an uncertain acquire", extra={"error": str(error)})
                await asyncio.sleep(0.2 * 2**attempt)
                continue
            if adopted is not None:
                logger.info(
                    "adopted a lease whose acquire reply was lost", extra={"epoch": adopted.lease.epoch}
                )
            return adopted
        # Still unknown. If it was applied: in connection mode it expires in one lease period;
        # in session mode our audit finds it (worker/audit.py) within its period.
        return None


def _rank_of_first(connection_id: str, claimers: tuple[str, ...]) -> int:
    """The place of `claimers[0]` in rendezvous.rank(connection_id, claimers), from 0, without
    sorting: how many of the others outweigh it (ties broken by id, as rank does)."""
    me, others = claimers[0], set(claimers[1:]) - {claimers[0]}
    mine = weight(connection_id, me)
    return sum(1 for other in others if (weight(connection_id, other), me) > (mine, other))
