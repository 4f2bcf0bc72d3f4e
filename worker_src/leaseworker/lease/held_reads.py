"""Reads of the connections a worker holds: ids from the `by-owner` index, then the items.

SessionHeldStore (lease/held_store.py) serves them as `owner_ids` and `owned_by` beside its claims
and frees; an OwnedConnection is what `owned_by` lists and `free_for` frees. Each call has a
deadline (lease/dynamodb.call_with_deadline).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leaseworker.lease.attribute_values import number, text
from leaseworker.lease.batch_get import batch_get_items
from leaseworker.lease.dynamodb import call_with_deadline
from leaseworker.lease.model import NO_CHECKPOINT, STARTED, is_expired
from leaseworker.lease.vocabulary import INDEX_BY_OWNER, SESSION_HELD
from leaseworker.settings import Settings

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb import DynamoDBClient


_OWNED_PROJECTION = "connection_id, lease_owner, lease_epoch, last_seq, lease_expires_at_ms, desired_state"


@dataclass(frozen=True, slots=True)
class OwnedConnection:
    connection_id: str
    epoch: int
    last_seq: int
    session_held: bool  # False: a connection-mode lease (claimable only on a confirmed fence)
    started: bool
    expires_at_ms: int  # as read: a free_for is conditioned on it

    def lapsed(self, now_ms: int, settings: Settings) -> bool:
        """A connection-mode lease that has expired by the acquire rule (`model.is_expired`): its
        holder delivers nothing more, fenced or not."""
        return not self.session_held and is_expired(self.expires_at_ms, now_ms, settings)


class HeldReads:
    """The `by-owner` index and the items it lists, each call with a deadline."""

    def __init__(self, client: DynamoDBClient, settings: Settings, *, call_timeout: float = 5.0) -> None:
        self._client = client
        self._table = settings.table_name
        self._call_timeout = call_timeout

    async def owner_ids(self, worker: str) -> list[str]:
        """The ids the `by-owner` index lists for `worker` (KEYS_ONLY, eventually consistent:
        0.5 read unit per 4 KB of index entries, about 50 bytes each)."""
        ids: list[str] = []
        start_key: dict[str, Any] | None = None
        while True:
            kwargs: dict[str, Any] = {
                "TableName": self._table,
                "IndexName": INDEX_BY_OWNER,
                "KeyConditionExpression": "lease_owner = :owner",
                "ExpressionAttributeValues": {":owner": {"S": worker}},
            }
            if start_key:
                kwargs["ExclusiveStartKey"] = start_key
            response = await call_with_deadline(self._client.query(**kwargs), self._call_timeout)
            ids.extend(item["connection_id"]["S"] for item in response.get("Items", []))
            start_key = response.get("LastEvaluatedKey")
            if not start_key:
                break
        return ids

    async def owned_by(self, worker: str) -> list[OwnedConnection]:
        """The connections `worker` holds: one `by-owner` query, then reads of those items.

        The index is KEYS_ONLY, so it gives ids, not epochs; the BatchGetItem (0.5 read unit per
        item) also checks the index was not stale (the owner must still be `worker`).
        """
        ids = await self.owner_ids(worker)
        items = await batch_get_items(
            self._client,
            self._table,
            [{"connection_id": {"S": cid}} for cid in ids],
            timeout=self._call_timeout,
            consistent=True,
            projection=_OWNED_PROJECTION,
        )
        owned = [
            OwnedConnection(
                connection_id=text(item, "connection_id") or "",
                epoch=number(item, "lease_epoch"),
                last_seq=number(item, "last_seq", NO_CHECKPOINT),
                session_held=number(item, "lease_expires_at_ms") == SESSION_HELD,
                started=text(item, "desired_state") == STARTED,
                expires_at_ms=number(item, "lease_expires_at_ms"),
            )
            for item in items
            if text(item, "lease_owner") == worker
        ]
        return sorted(owned, key=lambda c: c.connection_id)
