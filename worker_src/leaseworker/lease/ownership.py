"""The ownership interface the worker's loops use, and its `connection`-mode implementation.

The worker never talks to the store directly: it asks an `Ownership` for claimable connections,
claims them, renews what it holds and checkpoints and releases under the epoch it holds. Session
mode (DESIGN.md §2b) slots in as a second implementation of the same interface.
"""

from __future__ import annotations

from typing import Protocol

from leaseworker.lease.errors import AcquireUncertain
from leaseworker.lease.model import ConnectionItem, Lease
from leaseworker.lease.store import Acquired, AcquireResult, FleetView, LeaseStore, RenewResult
from leaseworker.settings import Settings


class Ownership(Protocol):
    async def find_claimable(self, limit: int) -> list[str]: ...

    async def claim(self, connection_id: str) -> AcquireResult: ...

    async def resolve_uncertain(self, uncertain: AcquireUncertain) -> Acquired | None: ...

    async def renew(self, lease: Lease, *, timeout: float) -> RenewResult: ...

    async def checkpoint(self, lease: Lease, seq: int) -> bool: ...

    async def release(self, lease: Lease, last_seq: int | None) -> bool: ...

    async def mark_failed(self, lease: Lease, reason: str) -> bool: ...

    async def record_failure(self, lease: Lease, reason: str) -> bool: ...

    async def status(self, connection_id: str) -> ConnectionItem | None: ...

    async def announce(self, *, load: int) -> None: ...

    async def withdraw(self) -> None: ...

    async def fleet_view(self) -> FleetView: ...


class ConnectionLeases:
    """`connection` mode: one lease per connection item, each renewed every heartbeat."""

    def __init__(self, store: LeaseStore, settings: Settings) -> None:
        self._store = store
        self._settings = settings
        self._me = settings.worker_id

    async def find_claimable(self, limit: int) -> list[str]:
        return await self._store.find_orphans(limit)

    async def claim(self, connection_id: str) -> AcquireResult:
        return await self._store.acquire(connection_id, self._me)

    async def resolve_uncertain(self, uncertain: AcquireUncertain) -> Acquired | None:
        return await self._store.resolve_uncertain(uncertain, self._me)

    async def renew(self, lease: Lease, *, timeout: float) -> RenewResult:
        return await self._store.renew(lease, timeout=timeout)

    async def checkpoint(self, lease: Lease, seq: int) -> bool:
        return await self._store.checkpoint(lease, seq)

    async def release(self, lease: Lease, last_seq: int | None) -> bool:
        return await self._store.release(lease, last_seq)

    async def mark_failed(self, lease: Lease, reason: str) -> bool:
        return await self._store.mark_failed(lease, reason)

    async def record_failure(self, lease: Lease, reason: str) -> bool:
        return await self._store.record_failure(lease, reason)

    async def status(self, connection_id: str) -> ConnectionItem | None:
        return await self._store.get(connection_id)

    async def announce(self, *, load: int) -> None:
        await self._store.announce(self._me, load=load, capacity=self._settings.max_connections)

    async def withdraw(self) -> None:
        await self._store.withdraw(self._me)

    async def fleet_view(self) -> FleetView:
        return await self._store.fleet_view()
