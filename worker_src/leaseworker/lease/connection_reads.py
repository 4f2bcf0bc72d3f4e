"""Reads of connection items: one item by id, and Queries of the by-state-expiry index.

ConnectionStore (lease/connection_store.py) adds the conditional lease writes to these reads; both
share the client, the table and the per-call deadline held here (lease/dynamodb.call_with_deadline).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from leaseworker.lease.dynamodb import call_with_deadline, now_ms
from leaseworker.lease.model import STARTED, ConnectionItem
from leaseworker.lease.vocabulary import INDEX_BY_STATE_EXPIRY
from leaseworker.settings import Settings

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb import DynamoDBClient


T = TypeVar("T")


class ConnectionReads:
    """Consistent reads of connection items and Queries of by-state-expiry, each with a deadline."""

    def __init__(self, client: DynamoDBClient, settings: Settings, *, call_timeout: float = 5.0) -> None:
        self._client = client
        self._settings = settings
        self._table = settings.table_name
        self._call_timeout = call_timeout

    async def get(self, connection_id: str) -> ConnectionItem | None:
        response = await self._call(
            self._client.get_item(
                TableName=self._table, Key={"connection_id": {"S": connection_id}}, ConsistentRead=True
            )
        )
        item = response.get("Item")
        return ConnectionItem.from_attributes(item) if item else None

    # ------------------------------------------------------------------ queries

    async def find_orphans(self, limit: int) -> list[str]:
        """STARTED connections that are free: new (expiry 0), released (0) or expired."""
        threshold = now_ms() - self._settings.max_clock_skew_ms
        found: list[str] = []
        start_key: dict[str, Any] | None = None
        while len(found) < limit:
            kwargs: dict[str, Any] = {
                "TableName": self._table,
                "IndexName": INDEX_BY_STATE_EXPIRY,
                "KeyConditionExpression": "desired_state = :started AND lease_expires_at_ms < :threshold",
                "ExpressionAttributeValues": {
                    ":started": {"S": STARTED},
                    ":threshold": {"N": str(threshold)},
                },
                "ProjectionExpression": "connection_id",
                "Limit": max(1, min(limit - len(found), 1000)),
            }
            if start_key:
                kwargs["ExclusiveStartKey"] = start_key
            response = await self._call(self._client.query(**kwargs))
            found.extend(item["connection_id"]["S"] for item in response.get("Items", []))
            start_key = response.get("LastEvaluatedKey")
            if not start_key:
                break
        return found[:limit]

    async def query(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """One page of a Query, under the store's deadline and error translation."""
        return dict(await self._call(self._client.query(**kwargs)))

    async def count_free(self) -> int:
        """STARTED connections nobody holds: new (expiry 0), released (0) or expired.

        Reads only the free part of the index (COUNT costs what returning the keys costs), never
        every connection item.
        """
        return await self._count_free(now_ms() - self._settings.max_clock_skew_ms)

    async def _count_free(self, threshold: int) -> int:
        total = 0
        start_key: dict[str, Any] | None = None
        while True:
            kwargs: dict[str, Any] = {
                "TableName": self._table,
                "IndexName": INDEX_BY_STATE_EXPIRY,
                "KeyConditionExpression": "desired_state = :s AND lease_expires_at_ms < :t",
                "ExpressionAttributeValues": {":s": {"S": STARTED}, ":t": {"N": str(threshold)}},
                "Select": "COUNT",
            }
            if start_key:
                kwargs["ExclusiveStartKey"] = start_key
            response = await self._call(self._client.query(**kwargs))
            total += int(response.get("Count", 0))
            start_key = response.get("LastEvaluatedKey")
            if not start_key:
                return total

    # ------------------------------------------------------------------ plumbing

    async def _call(self, awaitable: Awaitable[T], *, timeout: float | None = None) -> T:
        return await call_with_deadline(awaitable, self._call_timeout if timeout is None else timeout)
