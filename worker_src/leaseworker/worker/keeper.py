"""Connection-mode renewals (docs/design.md §2a): every lease on its own schedule, pipelined.

A renewal is sent every HEARTBEAT_SECONDS after the previous one was SENT, whether or not that
one has answered: renewals of one lease are pipelined (up to MAX_IN_FLIGHT per lease). Each one
that succeeds moves the local deadline to its own send time + local validity (§2d), so S1 rests
on send times exactly as before. The keeper starts each due renewal as its own task and never
waits for a round to finish, so one slow or stalled round trip delays only the renewal it carries.

Each attempt is bounded by its own local validity (`model.renewal_timeout`): past that it could
extend nothing. It is not cut at the lease's current deadline, since a renewal sent earlier may
still land and move that deadline first. A failed attempt is retried after RETRY_FRACTION of a
heartbeat while the lease is valid locally.

Where the time went before (issue 20, 3b): renewals were sent one after another, each bounded by
min(1.5 H, the lease's remaining validity). With a 1.4 s round trip against LEASE_SECONDS = 3,
H = 1 (validity 2.5 s), each renewal was sent about 1.1 s before the deadline and cancelled at it
("exceeded its 1.09 s deadline"), although it would have landed within the lease it extends; even
uncut, serial renewals need 2 round trips per validity (R < V/2 = 1.25 s).

The bound now (V = LEASE_SECONDS − MAX_CLOCK_SKEW − margin): each renewal is bounded by its own
validity, and one that answers extends the lease from its send time. Deliveries stop at the
local deadline as before (S1), but past it a lease with a renewal sent before the deadline still
in flight is not lost yet (`Lease.awaiting_renewal`): the session holds its socket and delivers
nothing until that renewal has answered. No renewal is sent while the lease is not valid (one
that landed would extend the table's lease while we serve nothing: the fault suite's ddb_stall
took over 2.5 s later). So with R < V − H nothing pauses; up to R ≤ 2H (while V > 2H) the
renewal due at each heartbeat still finds the lease valid, deliveries pause for up to
R − (V − H) per heartbeat, and the lease stays. At the local fleet's timings (V = 2.5 s,
H = 1 s) that is 1.5 s and 2 s; at the defaults (V = 17 s, H = 5 s) 12 s and 10 s (V − H
governs), which the lease client's read timeout allows (aws.lease_client_config). Before, the
lease was lost at the deadline, so R < V − H was a cliff:
the 1.4 s round trip of tests/worker/integration/test_latency_keeps_leases.py kept every lease alone and lost
half of them once CI's load added a tenth of a second. Leases × R / H renewals are in flight;
RENEW_CONCURRENCY bounds them below the lease client's connection pool (64,
`aws.lease_client_config`), so renewals never queue behind checkpoints at the pool.

Pipelined renewals may land out of order; the store's renewal only moves the expiry forward
(`connection_expressions.COND_RENEW`), so an older one landing late never shortens what a newer one wrote.
"""

from __future__ import annotations

import asyncio
import math

from leaseworker.clock import monotonic
from leaseworker.lease.errors import StoreError
from leaseworker.lease.model import renewal_timeout
from leaseworker.lease.ownership import Ownership
from leaseworker.lease.results import Lost, Renewed, Stopped
from leaseworker.observability.logging import get_logger
from leaseworker.observability.metrics import WorkerMetrics
from leaseworker.observability.tracing import Tracing
from leaseworker.settings import Settings
from leaseworker.worker.registry import Owned, Registry
from leaseworker.worker.waits import wait_any

logger = get_logger(__name__)

RENEW_CONCURRENCY = 48
RETRY_FRACTION = 0.2


def max_in_flight(settings: Settings) -> int:
    """Renewals of one lease on the wire at once: as many as fit in one local validity."""
    return max(1, math.ceil(settings.local_validity_seconds / settings.heartbeat_seconds))


class LeaseKeeper:
    def __init__(
        self,
        ownership: Ownership,
        registry: Registry,
        settings: Settings,
        metrics: WorkerMetrics,
        tracing: Tracing,
    ) -> None:
        self._ownership = ownership
        self._registry = registry
        self._settings = settings
        self._metrics = metrics
        self._tracing = tracing
        self._gate = asyncio.Semaphore(RENEW_CONCURRENCY)
        self._finished = asyncio.Event()  # a renewal ended: its lease's next one may be due already

    async def run(self, done: asyncio.Event) -> None:
        period = self._settings.heartbeat_seconds
        limit = max_in_flight(self._settings)
        async with asyncio.TaskGroup() as group:
            while not done.is_set():
                now = monotonic()
                for owned in self._registry.live():
                    if owned.next_renewal == 0.0:  # just acquired: the claim itself was a renewal
                        owned.next_renewal = owned.acquired_at + period
                ready = [o for o in self._registry.live() if o.renewing < limit]
                due = [o for o in ready if o.next_renewal <= now]
                if due:
                    for owned in due:
                        owned.renewing += 1
                        owned.next_renewal = now + period  # the next one is due a period after this send
                    group.create_task(self._renew_batch(due))
                waiting = [o.next_renewal for o in self._registry.live() if o.renewing < limit]
                wake = min(waiting, default=now + period)
                self._registry.changed.clear()
                self._finished.clear()
                await wait_any(max(0.0, wake - monotonic()), done, self._registry.changed, self._finished)

    async def _renew_batch(self, due: list[Owned]) -> None:
        """One span per batch of leases that fell due together (usually one reconcile's claims)."""
        with self._tracing.span("lease.renew_batch", leases=len(due)):
            async with asyncio.TaskGroup() as group:
                for owned in due:
                    group.create_task(self._renew(owned))

    async def _renew(self, owned: Owned) -> None:
        lease = owned.lease
        try:
            async with self._gate:
                sent_at = monotonic()
                if not lease.is_valid(sent_at):
                    return  # lapsed or lost: the session's fence timer has stopped delivery
                with lease.renewal_in_flight(sent_at):  # past the deadline, the session waits for it
                    await self._renew_sent(owned, sent_at)
        finally:
            owned.renewing -= 1
            self._finished.set()

    async def _renew_sent(self, owned: Owned, sent_at: float) -> None:
        lease = owned.lease
        try:
            result = await self._ownership.renew(lease, timeout=renewal_timeout(self._settings))
        except StoreError as error:
            retry = RETRY_FRACTION * self._settings.heartbeat_seconds
            owned.next_renewal = min(owned.next_renewal, monotonic() + retry)
            logger.warning(
                "renewal failed; retrying while the lease is valid",
                extra={
                    "connection_id": lease.connection_id,
                    "error": str(error),
                    "sent_ago": round(monotonic() - sent_at, 3),
                },
            )
            return
        if isinstance(result, Renewed):
            lease.renewed(sent_at, self._settings)
        elif isinstance(result, Stopped):
            logger.info("connection stopped by operator", extra={"connection_id": lease.connection_id})
            owned.session.request_release("desired_state STOPPED")
        elif isinstance(result, Lost) and owned.settling:
            # Its session has ended and its release (or failure mark) is being written: a
            # renewal that was on the wire lands after it and is refused, rightly. The settler
            # reports how the hand-back went; this is no loss (seen: 399 false warnings in one
            # graceful shutdown of 400 connections).
            logger.debug("renewal refused after the release", extra={"connection_id": lease.connection_id})
        elif isinstance(result, Lost):
            logger.warning(
                "renewal refused; dropping the connection",
                extra={"connection_id": lease.connection_id, "reason": result.reason},
            )
            owned.session.lose(result.reason)
