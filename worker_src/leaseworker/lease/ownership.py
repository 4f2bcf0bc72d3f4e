"""How a worker holds its own connections: the interface its loops use, and `connection` mode.

The worker never talks to the connection items directly: it asks an `Ownership` for claimable
connections, claims them (free ones, or a fenced peer's), checkpoints and releases under the
epoch it holds. Two implementations: `ConnectionLeases` (docs/design.md §2a, a lease per connection
renewed every heartbeat) and `SessionLeases` (§2b, in session_leases.py: connections held by the
worker's session item). The session item itself (§2.0) is the same in both modes and is not
part of this interface.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from leaseworker.lease.connection_store import ConnectionStore
from leaseworker.lease.dynamodb import now_ms
from leaseworker.lease.errors import AcquireUncertain, StoreError
from leaseworker.lease.held_store import OwnedConnection, SessionHeldStore
from leaseworker.lease.model import NO_CHECKPOINT, ConnectionItem, Lease, local_deadline
from leaseworker.lease.results import Acquired, AcquireResult, RenewResult
from leaseworker.settings import LeaseMode, Settings


@dataclass(frozen=True, slots=True)
class Progress:
    """One held lease in a checkpoint round: what the sink accepted, what is recorded."""

    lease: Lease
    delivered_seq: int
    checkpointed_seq: int
    cursor: str | None = None  # JSON text: the checkpoint cursor that goes with delivered_seq

    @property
    def advanced(self) -> bool:
        return self.delivered_seq > self.checkpointed_seq


@dataclass(frozen=True, slots=True)
class RoundResult:
    recorded: frozenset[str]  # connection ids whose delivered_seq is now durable
    lost: frozenset[str]  # connection ids whose lease turned out to be gone


class Ownership(Protocol):
    mode: LeaseMode

    async def find_claimable(self, limit: int) -> list[str]: ...

    async def claim(self, connection_id: str) -> AcquireResult: ...

    async def claim_from_dead(
        self,
        owned: OwnedConnection,
        *,
        dead: str,
        resume_seq: int,
        confirmed: bool,
        resume_cursor: str | None = None,
    ) -> AcquireResult: ...

    async def resolve_uncertain(self, uncertain: AcquireUncertain) -> Acquired | None: ...

    async def adopt(self, item: ConnectionItem | None, *, entry_seq: int = NO_CHECKPOINT) -> Acquired | None:
        """An item that names us but that nothing of ours serves (found by the audit): serve it
        (None if not), or release it conditionally with its effective checkpoint."""
        ...

    async def renew(self, lease: Lease, *, timeout: float) -> RenewResult: ...

    async def checkpoint_round(self, progress: Sequence[Progress]) -> RoundResult: ...

    async def stopped_held(self) -> list[str]: ...

    async def release(self, lease: Lease, last_seq: int | None, cursor: str | None = None) -> bool: ...

    async def mark_failed(
        self, lease: Lease, reason: str, last_seq: int | None = None, cursor: str | None = None
    ) -> bool: ...

    async def record_failure(self, lease: Lease, reason: str) -> bool: ...

    async def status(self, connection_id: str) -> ConnectionItem | None: ...


class ConnectionLeases:
    """`connection` mode: one lease per connection item, each renewed every heartbeat."""

    mode: LeaseMode = "connection"

    def __init__(self, store: ConnectionStore, held: SessionHeldStore, settings: Settings) -> None:
        self._store = store
        self._held = held
        self._settings = settings
        self._me = settings.worker_id

    async def find_claimable(self, limit: int) -> list[str]:
        return await self._store.find_orphans(limit)

    async def claim(self, connection_id: str) -> AcquireResult:
        return await self._store.acquire(connection_id, self._me)

    async def claim_from_dead(
        self,
        owned: OwnedConnection,
        *,
        dead: str,
        resume_seq: int,
        confirmed: bool,
        resume_cursor: str | None = None,
    ) -> AcquireResult:
        """A fenced peer's connection, held from now on by a lease of our own (mixed fleets)."""
        sent_at = time.monotonic()
        return await self._held.claim_from_dead(
            owned.connection_id,
            self._me,
            dead=dead,
            epoch=owned.epoch,
            resume_seq=resume_seq,
            resume_cursor=resume_cursor,
            valid_until=local_deadline(sent_at, self._settings),
            confirmed=confirmed,
            expires_at_ms=now_ms() + int(self._settings.lease_seconds * 1000),
        )

    async def resolve_uncertain(self, uncertain: AcquireUncertain) -> Acquired | None:
        return await self._store.resolve_uncertain(uncertain, self._me)

    async def adopt(self, item: ConnectionItem | None, *, entry_seq: int = NO_CHECKPOINT) -> Acquired | None:
        """A lease of ours that nothing here serves: its expiry says nothing about our local
        deadline (it may be a stale write of ours), so it is released, never adopted."""
        if item is None or item.lease_owner != self._me:
            return None
        lease = Lease(item.connection_id, item.lease_epoch, self._me, item.ws_url, item.last_seq, 0.0)
        await self._store.release(lease, max(item.last_seq, entry_seq))
        return None

    async def renew(self, lease: Lease, *, timeout: float) -> RenewResult:
        return await self._store.renew(lease, timeout=timeout)

    async def checkpoint_round(self, progress: Sequence[Progress]) -> RoundResult:
        """One conditional write per advanced lease (the caller bounds the concurrency)."""
        recorded: set[str] = set()
        lost: set[str] = set()
        for entry in progress:
            if not entry.advanced:
                continue
            cid = entry.lease.connection_id
            try:
                ok = await self._store.checkpoint(entry.lease, entry.delivered_seq, entry.cursor)
            except StoreError:
                continue
            (recorded if ok else lost).add(cid)
        return RoundResult(frozenset(recorded), frozenset(lost))

    async def stopped_held(self) -> list[str]:
        return []  # a renewal refused on desired_state tells us, one heartbeat after the stop

    async def release(self, lease: Lease, last_seq: int | None, cursor: str | None = None) -> bool:
        return await self._store.release(lease, last_seq, cursor)

    async def mark_failed(
        self, lease: Lease, reason: str, last_seq: int | None = None, cursor: str | None = None
    ) -> bool:
        return await self._store.mark_failed(lease, reason, last_seq, cursor)

    async def record_failure(self, lease: Lease, reason: str) -> bool:
        return await self._store.record_failure(lease, reason)

    async def status(self, connection_id: str) -> ConnectionItem | None:
        return await self._store.get(connection_id)
