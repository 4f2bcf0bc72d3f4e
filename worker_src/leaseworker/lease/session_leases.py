"""`session` mode (DESIGN.md §2b): connections held through the worker's session item.

A held connection item carries the marker expiry `SESSION_HELD`; nothing is written per
connection per heartbeat. Every lease shares the session's local deadline (`SessionValidity`,
moved forward by each successful heartbeat): a claim is made only while the session is valid,
and the new lease starts with the session's deadline. Checkpoints of all held connections go
out as one write of the worker's checkpoint item.

A STOPPED connection is noticed without a per-connection renewal: reconcile asks the index for
STOPPED items still carrying the marker (normally none; each is released within a reconcile).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from leaseworker.lease.checkpoint_store import CheckpointStore
from leaseworker.lease.errors import AcquireUncertain, StoreError
from leaseworker.lease.held_store import SESSION_HELD, OwnedConnection, SessionHeldStore
from leaseworker.lease.liveness import SessionValidity
from leaseworker.lease.model import STOPPED, ConnectionItem, Lease
from leaseworker.lease.ownership import Progress, RoundResult
from leaseworker.lease.store import GSI_BY_STATE_EXPIRY, Acquired, AcquireResult, LeaseStore, Lost, Renewed
from leaseworker.settings import LeaseMode, Settings


class SessionLeases:
    mode: LeaseMode = "session"

    def __init__(
        self,
        store: LeaseStore,
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

    def _valid_until(self) -> float | None:
        return self._validity.valid_until if self._validity.is_valid(time.monotonic()) else None

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
        return None  # claim_free raises no AcquireUncertain: its lost replies expire with the session

    async def renew(self, lease: Lease, *, timeout: float) -> Renewed:
        return Renewed()  # the session heartbeat renews every session-held lease at once

    async def checkpoint_round(self, progress: Sequence[Progress]) -> RoundResult:
        """Every live lease's (epoch, seq) in one write, when any of them advanced."""
        if not any(entry.advanced for entry in progress):
            return RoundResult(frozenset(), frozenset())
        valid_until = self._valid_until()
        if valid_until is None:
            return RoundResult(frozenset(), frozenset())
        entries = {e.lease.connection_id: (e.lease.epoch, e.delivered_seq) for e in progress}
        cursors = {e.lease.connection_id: e.cursor for e in progress if e.cursor is not None}
        try:
            ok = await self._checkpoints.write(
                self._me, entries, cursors=cursors, timeout=max(0.01, valid_until - time.monotonic())
            )
        except StoreError:
            return RoundResult(frozenset(), frozenset())
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
                "IndexName": GSI_BY_STATE_EXPIRY,
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
