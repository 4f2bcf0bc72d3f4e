"""BatchGetItem of up to 100 keys, retrying what DynamoDB left unprocessed, under one deadline."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from leaseworker.lease.dynamodb import call_with_deadline
from leaseworker.lease.errors import StoreUnavailable

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb import DynamoDBClient

BATCH_GET_LIMIT = 100  # BatchGetItem's maximum keys per request
UNPROCESSED_RETRY_SECONDS = 0.05


async def batch_get_items(
    client: DynamoDBClient,
    table: str,
    keys: list[dict[str, Any]],
    *,
    timeout: float,
    consistent: bool = False,
    projection: str | None = None,
) -> list[dict[str, Any]]:
    """The items that exist among `keys`, in no particular order.

    Each batch of 100 gets `timeout` seconds in all, retries included: DynamoDB returns
    UnprocessedKeys when it throttles part of a batch, and asks the caller to back off.
    """
    items: list[dict[str, Any]] = []
    for start in range(0, len(keys), BATCH_GET_LIMIT):
        request_for_table: dict[str, Any] = {"Keys": keys[start : start + BATCH_GET_LIMIT]}
        request_for_table["ConsistentRead"] = consistent
        if projection:
            request_for_table["ProjectionExpression"] = projection
        request: dict[str, Any] = {table: request_for_table}
        try:
            async with asyncio.timeout(timeout):
                while request:
                    response = await call_with_deadline(client.batch_get_item(RequestItems=request), timeout)
                    items.extend(response.get("Responses", {}).get(table, []))
                    request = dict(response.get("UnprocessedKeys") or {})
                    if request:
                        await asyncio.sleep(UNPROCESSED_RETRY_SECONDS)
        except TimeoutError:
            raise StoreUnavailable(f"BatchGetItem exceeded its {timeout:.2f} s deadline") from None
    return items
