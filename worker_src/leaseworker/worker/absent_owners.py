"""The fleet's sweep for connections held by a session that no longer exists (review D).

One worker (the first live id, so the fleet pays for one sweep) lists the by-owner index every
SWEEP_EVERY_LEASES lease periods. An owner that no session listing showed is read consistently;
if its session item is absent, a fenced stub is written for it (`lease.absent_owners`), counted
in `LeasesRepaired`, and the usual takeover of a fenced session follows. The stub's fence says
nothing about when the owner last heartbeat, so the takeover waits LEASE_SECONDS from our first
sight of the stub on our own monotonic clock: any heartbeat of the owner that succeeded did so
before the stub existed (afterwards it fails on the fence), so its session deadline has passed
by then, as after an observed fence (docs/design.md §2b).

Cost: one Scan of the KEYS_ONLY by-owner index per sweep, about ⌈N × 50 B / 4 KB⌉ × 0.5 read
units for N held connections (2,000: about 13 RRU), once per 3 L for the whole fleet, plus one
consistent read per unknown owner (none in a healthy fleet).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from leaseworker.lease.absent_owners import AbsentOwnerStore
from leaseworker.lease.errors import StoreError
from leaseworker.lease.liveness import ABSENT, SessionInfo
from leaseworker.observability.logging import get_logger
from leaseworker.observability.metrics import MetricName, WorkerMetrics

if TYPE_CHECKING:
    from leaseworker.lease.session_store import SessionStore

logger = get_logger(__name__)

SWEEP_EVERY_LEASES = 3


class AbsentOwners:
    def __init__(
        self,
        *,
        store: AbsentOwnerStore,
        sessions: SessionStore,
        me: str,
        lease_seconds: float,
        metrics: WorkerMetrics,
    ) -> None:
        self._store = store
        self._sessions = sessions
        self._me = me
        self._lease_seconds = lease_seconds
        self._metrics = metrics
        self._swept_at = -math.inf
        self._stub_seen: dict[str, float] = {}  # stubbed owner -> our first sight (monotonic)

    def may_take_over(self, worker: str, session: SessionInfo, now: float) -> bool:
        """False while a stub fenced for an absent session is younger than L on our clock."""
        if session.fence_kind != ABSENT:
            return True
        return now - self._stub_seen.setdefault(worker, now) >= self._lease_seconds

    def forget(self, worker: str) -> None:
        self._stub_seen.pop(worker, None)

    async def sweep_if_due(self, *, listed: set[str], live: list[str], now: float) -> int:
        """Sweep when due and we are the fleet's first live worker; the stubs written."""
        if min(live, default=self._me) < self._me:
            return 0
        if now - self._swept_at < SWEEP_EVERY_LEASES * self._lease_seconds:
            return 0
        self._swept_at = now
        try:
            return await self._sweep(listed)
        except StoreError as error:
            logger.warning("could not sweep for absent owners", extra={"error": str(error)})
            return 0

    async def _sweep(self, listed: set[str]) -> int:
        owners = await self._store.held_owners()
        written = 0
        for owner in sorted(owners - listed - {self._me}):
            if await self._sessions.get(owner) is not None:
                continue  # a session the listing missed (new, or an index lag): it is alive
            reason = f"held connections, but its session item was absent when {self._me} swept"
            if await self._store.fence_absent(owner, me=self._me, reason=reason):
                written += 1
                self._metrics.count(MetricName.LeasesRepaired)
                logger.warning("fenced an absent session that still holds connections", extra={"peer": owner})
        return written
