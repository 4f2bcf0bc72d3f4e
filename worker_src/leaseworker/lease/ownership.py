"""How a worker holds its own connections: the interface its loops use, and `connection` mode.

The worker never talks to the connection items directly: it asks an `Ownership` for claimable
connections, claims them (free ones, or a fenced peer's), checkpoints and releases under the
epoch it holds. Two implementations: `ConnectionLeases` (docs/design.md §2a, a lease per connection
renewed every heartbeat) and `SessionLeases` (§2b, in session_leases.py: connections held by the
worker's session item). The session item itself (§2.0) is the same in both modes and is not
part of this interface.

The lease mode is chosen once, when the worker builds its Ownership (worker/main.py), and no
other module tests it: what differs between the modes is asked of the Ownership. That is which
leases a checkpoint round writes and how (one write per advanced lease, or one batched write),
whether a session heartbeat extends the leases (and so whether they wait for one in flight past
their deadline), whether a lease lost to us locally is handed
back, whether an unreleased lease may be left to expire, and whether the keeper loop renews
each lease on its own schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from leaseworker.clock import monotonic
from leaseworker.lease.connection_store import ConnectionStore
from leaseworker.lease.dynamodb import now_ms
from leaseworker.lease.errors import AcquireUncertain, StoreError
from leaseworker.lease.held_reads import OwnedConnection
from leaseworker.lease.held_store import SessionHeldStore
from leaseworker.lease.model import NO_CHECKPOINT, ConnectionItem, Lease, local_deadline, renewal_timeout
from leaseworker.lease.results import Acquired, AcquireResult, Renewed, RenewResult, Stopped
from leaseworker.settings import LeaseMode, Settings

# Connection mode's checkpoint writes in flight at once: well below the lease client's pool
# (aws.lease_client_config), so renewals never queue behind a round of checkpoints.
CHECKPOINT_CONCURRENCY = 16


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
    mode: LeaseMode  # for logs and the session item only: behaviour is asked of the methods below
    renews_each_lease: bool  # the keeper loop (worker/keeper.py) renews every lease on its own

    def checkpoint_scope(self, live: Sequence[Progress], lapsed: Sequence[Progress]) -> list[Progress]:
        """The leases a checkpoint round writes, from the live ones and the lapsed ones (lost to
        us locally, not handed back yet): empty when no write is due."""
        ...

    def heartbeat_in_flight(self, leases: Iterable[Lease], sent_at: float) -> AbstractContextManager[None]:
        """While a session heartbeat sent at monotonic `sent_at` is on the wire: the leases it
        would extend wait for its answer past their deadline (`Lease.awaiting_renewal`)."""
        ...

    def heartbeat_landed(self, leases: Iterable[Lease]) -> None:
        """A session heartbeat succeeded: move these live leases' local deadlines as it allows."""
        ...

    def hands_back(self, lease: Lease) -> bool:
        """This lost lease may still be held in the table by us: hand it back (worker/settle.py)."""
        ...

    def left_to_expire(self, lease: Lease, now: float) -> bool:
        """A release of this lease that did not land may be given up: the table's lease runs out."""
        ...

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
    renews_each_lease = True

    def __init__(self, store: ConnectionStore, held: SessionHeldStore, settings: Settings) -> None:
        self._store = store
        self._held = held
        self._settings = settings
        self._me = settings.worker_id
        self._gate = asyncio.Semaphore(CHECKPOINT_CONCURRENCY)

    def checkpoint_scope(self, live: Sequence[Progress], lapsed: Sequence[Progress]) -> list[Progress]:
        """Each advanced lease on its own. A lapsed lease's item expires by itself."""
        return [entry for entry in live if entry.advanced]

    def heartbeat_in_flight(self, leases: Iterable[Lease], sent_at: float) -> AbstractContextManager[None]:
        return contextlib.nullcontext()  # a heartbeat extends no lease: nothing waits for it

    def heartbeat_landed(self, leases: Iterable[Lease]) -> None:
        """Nothing: each lease is extended by its own renewal (the keeper)."""

    def hands_back(self, lease: Lease) -> bool:
        return False  # a lease of ours that we lost expires in the table by itself

    def left_to_expire(self, lease: Lease, now: float) -> bool:
        return not lease.is_valid(now)

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
        sent_at = monotonic()
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
        """Read back a claim whose reply was lost, and adopt it if our write landed.

        Its local deadline counts from the claim's send time, and a read-back that came late
        (the replies that were lost were slow too) may find it past that deadline, or too close
        to it for the keeper's first renewal, a heartbeat after the session starts. Adopted as
        it is, the session self-fenced at once and the lease waited for its expiry in the table
        and a reconcile to take it back (the fault suite's ddb_lost_reply: 6.1 s unserved
        against L1's 5.9 s). Nothing has been served under it, so it is renewed here first,
        conditional on our owner and epoch like any renewal: a peer that took it by expiry
        meanwhile wins, and then nothing is ours. A renewal whose own reply is lost raises, and
        the caller's next read-back finds the lease at another expiry and releases it."""
        adopted = await self._store.resolve_uncertain(uncertain, self._me)
        if adopted is None:
            return None
        lease = adopted.lease
        sent_at = monotonic()
        if lease.valid_until - sent_at >= self._settings.heartbeat_seconds:
            return adopted
        result = await self._store.renew(lease, timeout=renewal_timeout(self._settings))
        if isinstance(result, Renewed):
            lease.renewed(sent_at, self._settings)
            return adopted
        if isinstance(result, Stopped):
            await self._store.release(lease, None)  # an operator's stop came first: not ours to serve
        return None

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
        """One conditional write per advanced lease, at most CHECKPOINT_CONCURRENCY at once."""
        recorded: set[str] = set()
        lost: set[str] = set()

        async def one(entry: Progress) -> None:
            async with self._gate:
                try:
                    ok = await self._store.checkpoint(entry.lease, entry.delivered_seq, entry.cursor)
                except StoreError:
                    return
            (recorded if ok else lost).add(entry.lease.connection_id)

        async with asyncio.TaskGroup() as group:
            for entry in progress:
                if entry.advanced:
                    group.create_task(one(entry))
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
