"""Connection-mode renewals (DESIGN.md §2a): every lease on its own schedule.

A renewal is due HEARTBEAT_SECONDS after the previous one was sent. The keeper starts each due
renewal as its own task and never waits for a round to finish, so one slow or stalled DynamoDB
round trip delays only the lease it carries: the others keep renewing (the seed's design, and
ours before this, renewed in rounds, so one stall of about a lease let every lease expire).

Each attempt is bounded by RENEW_ATTEMPT_HEARTBEATS heartbeats and by the lease's remaining local
validity, whichever is sooner; a failed attempt is retried after RETRY_FRACTION of a heartbeat
while the lease is still valid locally. A round trip of up to about a third of the lease (one
heartbeat at the minimum LEASE_SECONDS = 3 × HEARTBEAT_SECONDS) therefore fences no healthy lease.
The hard limit is half the local validity (a renewal that returns after R seconds sends the
next at once, which must return before the first one's validity ends): at the defaults
(validity 17 s) a round trip of 8.5 s; at the local fleet's scaled timings (2.5 s), 1.25 s.
Renewals of one lease never overlap: a late older renewal would overwrite a newer expiry.
RENEW_CONCURRENCY bounds the renewals in flight below the lease client's connection pool
(`aws.LEASE_POOL_CONNECTIONS`), so renewals never queue behind checkpoints at the pool.
"""

from __future__ import annotations

import asyncio
import time

from leaseworker.lease.errors import StoreError
from leaseworker.lease.model import renewal_timeout
from leaseworker.lease.ownership import Ownership
from leaseworker.lease.store import Lost, Renewed, Stopped
from leaseworker.observability.logging import get_logger
from leaseworker.observability.metrics import WorkerMetrics
from leaseworker.observability.tracing import Tracing
from leaseworker.settings import Settings
from leaseworker.worker.registry import Owned, Registry
from leaseworker.worker.waits import wait_any

logger = get_logger(__name__)

RENEW_CONCURRENCY = 48
RENEW_ATTEMPT_HEARTBEATS = 1.5
RETRY_FRACTION = 0.2


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
        async with asyncio.TaskGroup() as group:
            while not done.is_set():
                now = time.monotonic()
                for owned in self._registry.live():
                    if owned.next_renewal == 0.0:  # just acquired: the claim itself was a renewal
                        owned.next_renewal = owned.acquired_at + period
                due = [o for o in self._registry.live() if not o.renewing and o.next_renewal <= now]
                if due:
                    for owned in due:
                        owned.renewing = True
                    group.create_task(self._renew_batch(due))
                waiting = [o.next_renewal for o in self._registry.live() if not o.renewing]
                wake = min(waiting, default=now + period)
                self._registry.changed.clear()
                self._finished.clear()
                await wait_any(
                    max(0.0, wake - time.monotonic()), done, self._registry.changed, self._finished
                )

    async def _renew_batch(self, due: list[Owned]) -> None:
        """One span per batch of leases that fell due together (usually one reconcile's claims)."""
        with self._tracing.span("lease.renew_batch", leases=len(due)):
            async with asyncio.TaskGroup() as group:
                for owned in due:
                    group.create_task(self._renew(owned))

    async def _renew(self, owned: Owned) -> None:
        lease = owned.lease
        period = self._settings.heartbeat_seconds
        try:
            async with self._gate:
                sent_at = time.monotonic()
                timeout = min(renewal_timeout(lease, sent_at), RENEW_ATTEMPT_HEARTBEATS * period)
                if timeout <= 0:
                    return  # the session's fence timer has already stopped delivery
                try:
                    result = await self._ownership.renew(lease, timeout=timeout)
                except StoreError as error:
                    owned.next_renewal = time.monotonic() + RETRY_FRACTION * period
                    logger.warning(
                        "renewal failed; retrying while the lease is valid",
                        extra={"connection_id": lease.connection_id, "error": str(error)},
                    )
                    return
            owned.next_renewal = sent_at + period
            if isinstance(result, Renewed):
                lease.renewed(sent_at, self._settings)
            elif isinstance(result, Stopped):
                logger.info("connection stopped by operator", extra={"connection_id": lease.connection_id})
                owned.session.request_release("desired_state STOPPED")
            elif isinstance(result, Lost):
                logger.warning(
                    "renewal refused; dropping the connection",
                    extra={"connection_id": lease.connection_id, "reason": result.reason},
                )
                owned.session.lose(result.reason)
        finally:
            owned.renewing = False
            self._finished.set()
