"""`session` mode (docs/design.md §2b): connections held through the worker's session item.

A held connection item carries the marker expiry `SESSION_HELD`; nothing is written per
connection per heartbeat. Every lease shares the session's local deadline (`SessionValidity`,
moved forward by each successful heartbeat): a claim is made only while the session is valid,
and the new lease starts with the session's deadline. Checkpoints of all held connections go
out as one write of the worker's checkpoint item.

A STOPPED connection is noticed without a per-connection renewal: reconcile asks the index for
STOPPED items still carrying the marker (normally none; each is released within a reconcile).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from leaseworker.clock import monotonic
from leaseworker.lease.attribute_values import PURGE_AFTER_SECONDS
from leaseworker.lease.checkpoint_store import CheckpointStore
from leaseworker.lease.connection_store import ConnectionStore
from leaseworker.lease.errors import AcquireUncertain, StoreError
from leaseworker.lease.held_reads import OwnedConnection
from leaseworker.lease.held_store import SessionHeldStore
from leaseworker.lease.liveness import SessionValidity
from leaseworker.lease.model import (
    HAND_BACK_REASONS,
    NO_CHECKPOINT,
    STARTED,
    STOPPED,
    ConnectionItem,
    Lease,
    MalformedItem,
)
from leaseworker.lease.ownership import Progress, RoundResult
from leaseworker.lease.results import Acquired, AcquireResult, Lost, Renewed
from leaseworker.lease.vocabulary import INDEX_BY_STATE_EXPIRY, SESSION_HELD
from leaseworker.settings import LeaseMode, Settings

# A quarter of the checkpoint item's TTL: three chances to refresh it before it could expire.
CHECKPOINT_REFRESH_SECONDS = PURGE_AFTER_SECONDS / 4


class SessionLeases:
    mode: LeaseMode = "session"
    renews_each_lease = False  # the session heartbeat renews them all at once

    def __init__(
        self,
        store: ConnectionStore,
        held: SessionHeldStore,
        checkpoints: CheckpointStore,
        validity: SessionValidity,
        settings: Settings,
    ) -> None:
        self._store = store
        self._held = held
        self._checkpoints = checkpoints
        self._validity = validity
        self._settings = settings
        self._me = settings.worker_id
        self._written_at = -math.inf  # monotonic: our last checkpoint write that landed

    def checkpoint_scope(self, live: Sequence[Progress], lapsed: Sequence[Progress]) -> list[Progress]:
        """Every lease whose item still names us, advanced or not: the write replaces the whole
        map, and the entry is a lease's only fresh checkpoint until its release or hand-back
        lands. That covers releasing leases (a release that does not land must not leave the
        successor only the claim-time last_seq: review 2026-12-05, C2) and lapsed ones.
        Whether the write is due is checkpoint_round's call (it also refreshes the TTL, C3)."""
        return [*live, *lapsed]

    @contextlib.contextmanager
    def heartbeat_in_flight(self, leases: Iterable[Lease], sent_at: float) -> Iterator[None]:
        """The session heartbeat is every lease's renewal, so a lease past its deadline with a
        heartbeat in flight that was sent before it is not lost yet: its session delivers
        nothing until that heartbeat answers (bounded by its timeout, LEASE_SECONDS − margin),
        exactly as a connection-mode lease waits for its renewal. Only leases valid at the send
        count (`Lease.awaiting_renewal` checks `sent_at` against the deadline). If it lands, it
        was conditional on our session not being fenced, so no peer can have taken a lease, and
        it extends them from its own send time as every heartbeat does. Without it the round
        trip R < LEASE_SECONDS − margin − H was a cliff: a 0.3 s stall of a loaded machine on a
        1.4 s round trip (bound 1.7 s) lapsed the session and moved all eight leases of
        tests/worker/integration/test_latency_keeps_leases.py."""
        with contextlib.ExitStack() as waiting:
            for lease in leases:
                if lease.is_valid(sent_at):
                    waiting.enter_context(lease.renewal_in_flight(sent_at))
            yield

    def heartbeat_landed(self, leases: Iterable[Lease]) -> None:
        """Every session-held lease shares the session's deadline, just moved forward."""
        for lease in leases:
            lease.extend_to(self._validity.valid_until)

    def hands_back(self, lease: Lease) -> bool:
        """Lost to us (our own deadline, an upstream's stale_epoch) while the item may still name
        our session, which never expires: handed back, conditional on owner and epoch."""
        return lease.end_reason in HAND_BACK_REASONS

    def left_to_expire(self, lease: Lease, now: float) -> bool:
        return False  # a session-held item never expires: "left to expire" would strand it (B)

    def _valid_until(self) -> float | None:
        return self._validity.valid_until if self._validity.is_valid(monotonic()) else None

    async def find_claimable(self, limit: int) -> list[str]:
        return await self._store.find_orphans(limit)

    async def claim(self, connection_id: str) -> AcquireResult:
        valid_until = self._valid_until()
        if valid_until is None:
            return Lost(None, None, "our session is not valid: no claims until a heartbeat succeeds")
        return await self._held.claim_free(connection_id, self._me, valid_until=valid_until)

    async def claim_from_dead(
        self,
        owned: OwnedConnection,
        *,
        dead: str,
        resume_seq: int,
        confirmed: bool,
        resume_cursor: str | None = None,
    ) -> AcquireResult:
        valid_until = self._valid_until()
        if valid_until is None:
            return Lost(None, None, "our session is not valid: no claims until a heartbeat succeeds")
        return await self._held.claim_from_dead(
            owned.connection_id,
            self._me,
            dead=dead,
            epoch=owned.epoch,
            resume_seq=resume_seq,
            resume_cursor=resume_cursor,
            valid_until=valid_until,
            confirmed=confirmed,
        )

    async def resolve_uncertain(self, uncertain: AcquireUncertain) -> Acquired | None:
        """A claim whose reply was lost (a timeout, or an SDK retry that met our own write): read
        the item back. An item held by our session never expires, so an applied claim nobody
        serves would be stranded for the worker's lifetime (review 2026-12-05, A)."""
        try:
            item = await self._store.get(uncertain.connection_id)
        except MalformedItem:
            return None
        return await self.adopt(item)

    async def adopt(self, item: ConnectionItem | None, *, entry_seq: int = NO_CHECKPOINT) -> Acquired | None:
        """`item` names our session, but nothing of ours serves it: serve it from its effective
        checkpoint (max of the item's `last_seq` and our entry `entry_seq` at its epoch), or, if
        it cannot be served (STOPPED, our session not valid, not session-held), release it with
        that checkpoint, conditional on owner and epoch. None unless adopted.

        Adopting at the item's epoch is safe: no other worker can deliver it without a claim,
        which would change the epoch, and our session's deadline bounds our own delivery."""
        if item is None or item.lease_owner != self._me:
            return None
        effective = max(item.last_seq, entry_seq)
        valid_until = self._valid_until()
        if (
            item.lease_expires_at_ms == SESSION_HELD
            and item.desired_state == STARTED
            and valid_until is not None
        ):
            lease = Lease(item.connection_id, item.lease_epoch, self._me, item.ws_url, effective, valid_until)
            return Acquired(lease, None)
        lease = Lease(item.connection_id, item.lease_epoch, self._me, item.ws_url, item.last_seq, 0.0)
        await self._held.release(lease, effective)
        return None

    async def own_entries(self) -> dict[str, tuple[int, int]]:
        """Our own checkpoint item's entries (a consistent read)."""
        return await self._checkpoints.read(self._me)

    async def renew(self, lease: Lease, *, timeout: float) -> Renewed:
        return Renewed()  # the session heartbeat renews every session-held lease at once

    async def checkpoint_round(self, progress: Sequence[Progress]) -> RoundResult:
        """Every live lease's (epoch, seq) in one write, when any of them advanced, or when the
        item's TTL needs refreshing: a write sets `purge_at` (PURGE_AFTER_SECONDS ahead), and a
        worker whose feeds all stay idle for longer than that (a long market holiday) must not
        have its only fresh checkpoints deleted under it (review 2026-12-05, C3). So while
        anything is held the map is rewritten at least every CHECKPOINT_REFRESH_SECONDS."""
        stale = monotonic() - self._written_at >= CHECKPOINT_REFRESH_SECONDS
        if not any(entry.advanced for entry in progress) and not (progress and stale):
            return RoundResult(frozenset(), frozenset())
        valid_until = self._valid_until()
        if valid_until is None:
            return RoundResult(frozenset(), frozenset())
        entries = {e.lease.connection_id: (e.lease.epoch, e.delivered_seq) for e in progress}
        cursors = {e.lease.connection_id: e.cursor for e in progress if e.cursor is not None}
        try:
            ok = await self._checkpoints.write(
                self._me, entries, cursors=cursors, timeout=max(0.01, valid_until - monotonic())
            )
        except StoreError:
            return RoundResult(frozenset(), frozenset())
        if ok:
            self._written_at = monotonic()
        ids = frozenset(entries)
        # Refused only when our session is fenced: every lease is gone (the heartbeat stops us).
        return RoundResult(ids, frozenset()) if ok else RoundResult(frozenset(), ids)

    async def stopped_held(self) -> list[str]:
        """STOPPED connections still held by some session (KEYS_ONLY: ids only)."""
        found: list[str] = []
        start_key: dict[str, Any] | None = None
        while True:
            kwargs: dict[str, Any] = {
                "TableName": self._settings.table_name,
                "IndexName": INDEX_BY_STATE_EXPIRY,
                "KeyConditionExpression": "desired_state = :stopped AND lease_expires_at_ms = :held",
                "ExpressionAttributeValues": {
                    ":stopped": {"S": STOPPED},
                    ":held": {"N": str(SESSION_HELD)},
                },
            }
            if start_key:
                kwargs["ExclusiveStartKey"] = start_key
            response = await self._store.query(kwargs)
            found.extend(item["connection_id"]["S"] for item in response.get("Items", []))
            start_key = response.get("LastEvaluatedKey")
            if not start_key:
                return found

    async def release(self, lease: Lease, last_seq: int | None, cursor: str | None = None) -> bool:
        return await self._held.release(lease, last_seq, cursor)

    async def mark_failed(
        self, lease: Lease, reason: str, last_seq: int | None = None, cursor: str | None = None
    ) -> bool:
        return await self._held.mark_failed(lease, reason, last_seq, cursor)

    async def record_failure(self, lease: Lease, reason: str) -> bool:
        return await self._held.record_failure(lease, reason)

    async def status(self, connection_id: str) -> ConnectionItem | None:
        return await self._store.get(connection_id)
