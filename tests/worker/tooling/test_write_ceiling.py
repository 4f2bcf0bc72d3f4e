"""The P6 ceiling measurement (bench/write_ceiling.py) claims every item once, without
contention, and reports a rate: on DynamoDB Local, as in the bench."""

from __future__ import annotations

import asyncio

from bench import write_ceiling
from leaseworker.lease.vocabulary import SESSION_HELD
from leaseworker_dev.local.services import local_dynamodb


def test_the_ceiling_loop_claims_each_item_once(dynamodb_endpoint: str) -> None:
    result = write_ceiling.measure(dynamodb_endpoint, items=120, processes=2)
    assert result["claimed"] == 120 and result["refused"] == 0
    assert result["writes_per_s"] > 0 and result["seconds"] > 0

    async def held() -> list[int]:
        async with local_dynamodb(dynamodb_endpoint) as client:
            scan = await client.scan(TableName=write_ceiling.TABLE)
        return [int(item["lease_expires_at_ms"]["N"]) for item in scan["Items"]]

    # Each one was claimed the way a claim holds it: the session marker in the expiry index key.
    assert asyncio.run(held()) == [SESSION_HELD] * 120
