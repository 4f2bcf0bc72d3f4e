"""The session heartbeat (docs/design.md §2.0), in both lease modes.

Every HEARTBEAT_SECONDS the worker increments `hb` on its session item `worker#<id>`, publishing
its load and capacity, conditioned on not being fenced. A success moves the session's local
deadline to (send time + LEASE_SECONDS − margin); in session mode that deadline is every
held lease's deadline (§2d). A refusal means a peer or the supervisor fenced us: the worker
drops everything at once (`on_fenced`) and stops.

Periodic heartbeats are pipelined: one is sent every HEARTBEAT_SECONDS whether or not the previous
one has answered (at most MAX_IN_FLIGHT at once), and each success moves the deadline to its own
send time + LEASE_SECONDS − margin. Each attempt is bounded by that deadline of its own (past it a
success could extend nothing), not by the session's current deadline: an older heartbeat in flight
may still land and move that first. After a pause the schedule restarts from now instead of
firing a burst.

Where the time went before (issue 20, 3b): heartbeats were sent one after another, each cut at
min(1.5 H, the session's remaining validity). With a 1.4 s round trip against LEASE_SECONDS = 3,
H = 1, each was cancelled at about 1.3 s ("exceeded its 1.29 s deadline") although it would have
landed well within the session it extends, so the session lapsed and every lease moved. Now the
session is kept, and its `hb` moves every H on an observer's clock, while every round trip
R < LEASE_SECONDS − margin − H (1.7 s at the local fleet's timings, 13 s at the defaults); past
that, each lease waits for the heartbeat in flight that was sent before its deadline
(`Ownership.heartbeat_in_flight`) and delivers nothing meanwhile, so the session is kept while
R ≤ 2H as well, and a spike pauses deliveries instead of lapsing the session.
Pipelined heartbeats may land out of order, so under such latency a peer may briefly see an
older `load` (fair share only; `hb` is a counter and the deadline takes the maximum).

The published load counts the leases we mean to keep, not those being handed back. A claim is
published within CLAIM_PUBLISH_SECONDS (`publish_soon`), one beat for the claims of that time. A graceful
release outside shutdown (a rebalance, an operator's stop) publishes it first (`publish_load`):
otherwise a peer's view taken between the release and our next heartbeat counts the connection
twice, once in our stale load and once as free, claims it above its real share, and sheds it
again (a rebalance that bounced one connection for seconds; found by the soak's churn check).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from leaseworker.clock import monotonic
from leaseworker.lease.errors import StoreError
from leaseworker.lease.liveness import SessionValidity, session_deadline
from leaseworker.lease.ownership import Ownership
from leaseworker.lease.session_store import Fenced, SessionStore
from leaseworker.observability.logging import get_logger
from leaseworker.observability.tracing import Tracing
from leaseworker.settings import Settings
from leaseworker.worker.loops import survive
from leaseworker.worker.registry import Registry
from leaseworker.worker.waits import wait_any

logger = get_logger(__name__)

MAX_IN_FLIGHT = 4  # periodic heartbeats on the wire at once (a round trip of up to 4 H)
PUBLISH_WAIT_SECONDS = 0.5  # a release waits at most this long for its load to be published
CLAIM_PUBLISH_SECONDS = 0.25  # a claim shows in our published load after at most this (+ a write)


class SessionHeartbeat:
    def __init__(
        self,
        *,
        sessions: SessionStore,
        ownership: Ownership,
        registry: Registry,
        validity: SessionValidity,
        settings: Settings,
        tracing: Tracing,
        on_fenced: Callable[[Fenced], None],
        on_beat: Callable[[], None] | None = None,
        task_arn: str | None = None,
    ) -> None:
        self._sessions = sessions
        self._ownership = ownership
        self._registry = registry
        self._validity = validity
        self._settings = settings
        self._tracing = tracing
        self._on_fenced = on_fenced
        self._on_beat = on_beat
        self._task_arn = task_arn
        self.beats = 0
        self._beating = asyncio.Lock()  # one beat at a time: the periodic one or a publish
        self._publish: asyncio.Task[None] | None = None
        self._publish_began = False  # the publish task has read our load (too early to share)
        self._after_claims: asyncio.Task[None] | None = None

    async def run(self, done: asyncio.Event) -> None:
        period = self._settings.heartbeat_seconds
        next_at = monotonic() + period
        in_flight: set[asyncio.Task[None]] = set()
        try:
            while not done.is_set() and not self._validity.fenced:
                await wait_any(max(0.0, next_at - monotonic()), done)
                if done.is_set():
                    return
                next_at = max(next_at + period, monotonic())
                if len(in_flight) >= MAX_IN_FLIGHT:
                    continue  # every one of them still has time to land: no pile-up
                beat = asyncio.create_task(self._periodic_beat(), name="heartbeat:periodic")
                in_flight.add(beat)
                beat.add_done_callback(in_flight.discard)
        finally:
            for beat in list(in_flight):
                beat.cancel()
            if in_flight:
                await asyncio.gather(*in_flight, return_exceptions=True)
            if self._after_claims is not None:
                self._after_claims.cancel()

    async def _periodic_beat(self) -> None:
        """A periodic beat does not wait for the one before it (nor for a publish)."""
        with survive("heartbeat"):
            await self._beat()

    def publish_soon(self) -> None:
        """After a claim: publish our load within CLAIM_PUBLISH_SECONDS, by one beat for all the
        claims of that time. Until then peers count the claimed connection neither as free nor
        as our load: after a death every survivor saw a share that its peers' claims had already
        filled, stopped short, and the last few hundred connections waited for a reconcile or
        two (the simulator's takeover took 44 s instead of 35 s once claiming above the share
        was kept for the connections nobody has room for)."""
        if self._validity.fenced or (self._after_claims is not None and not self._after_claims.done()):
            return
        self._after_claims = asyncio.create_task(self._publish_after_claims(), name="heartbeat:after-claims")

    async def _publish_after_claims(self) -> None:
        await asyncio.sleep(CLAIM_PUBLISH_SECONDS)
        await self.publish_load()

    async def publish_load(self) -> None:
        """Publish our load now, by a heartbeat that reads it after this call: the releases of
        one round share a publish that has not read it yet. Waits at most PUBLISH_WAIT_SECONDS;
        a publish that fails only leaves peers with the stale load until the next heartbeat."""
        if self._validity.fenced:
            return
        if self._publish is None or self._publish_began:
            self._publish_began = False
            self._publish = asyncio.create_task(self._published_beat(), name="heartbeat:publish")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._publish), PUBLISH_WAIT_SECONDS)

    async def _published_beat(self) -> None:
        async with self._beating:
            self._publish_began = True  # _beat reads the load before its first await
            with survive("heartbeat"):
                await self._beat()

    def load(self) -> int:
        """The leases we mean to keep: not those being handed back, nor lapsed ones."""
        return len(self._registry.held())

    async def beat(self) -> bool:
        """One heartbeat; True when it succeeded."""
        async with self._beating:
            return await self._beat()

    async def _beat(self) -> bool:
        settings = self._settings
        sent_at = monotonic()
        # Until the deadline this very heartbeat would set: a success later extends nothing.
        timeout = session_deadline(sent_at, settings) - sent_at
        live = [owned.lease for owned in self._registry.live()]
        # Leases it extends wait for it past their deadline; landed, it extends them before they stop.
        with self._ownership.heartbeat_in_flight(live, sent_at):
            try:
                load = self.load()
                with self._tracing.span("session.heartbeat", load=load):
                    result = await self._sessions.heartbeat(
                        settings.worker_id,
                        load=load,
                        capacity=settings.max_connections,
                        lease_mode=settings.lease_mode,
                        task_arn=self._task_arn,
                        timeout=timeout,
                    )
            except StoreError as error:
                logger.warning(
                    "session heartbeat failed",
                    extra={"error": str(error), "sent_ago": round(monotonic() - sent_at, 3)},
                )
                return False
            if isinstance(result, Fenced):  # `on_fenced` says whose fence it is, and logs it
                self._validity.fence()
                self._on_fenced(result)
                return False
            self.beats += 1
            self._validity.heartbeat_succeeded(sent_at)
            self._ownership.heartbeat_landed(owned.lease for owned in self._registry.live())
        if self._on_beat is not None:
            self._on_beat()
        return True
