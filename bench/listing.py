"""Reads per worker per heartbeat in session mode, with 100 and with 2,000 connections present.

A fleet of 2,000 connections at scaled timings would exceed DynamoDB Local's ~600 writes/s on
this machine while it claims them, so this measures the listing cost directly: a fresh DynamoDB
Local holds the session run's session items plus N connection items held by those sessions,
and each read kind the session workers sent (captured samples) is replayed and priced there.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench.capacity import CrossCheck
from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.vocabulary import WORKER_KEY_PREFIX
from leaseworker_dev.local.fleet import TABLE
from leaseworker_dev.local.services import local_dynamodb, start_dynamodb_local

HELD = str(2**53 - 1)  # the session marker in lease_expires_at_ms (docs/design.md §2b)


def connection_item(index: int, owner: str) -> dict[str, Any]:
    return {
        "connection_id": {"S": f"held-{index:05d}"},
        "desired_state": {"S": "STARTED"},
        "ws_url": {"S": f"ws://127.0.0.1:9/feeds/held-{index:05d}"},
        "lease_owner": {"S": owner},
        "lease_epoch": {"N": "1"},
        "lease_expires_at_ms": {"N": HELD},
        "last_seq": {"N": "12345"},
        "updated_at_ms": {"N": "1796300000000"},
    }


async def _measure(
    endpoint: str,
    sessions: list[dict[str, Any]],
    reads: dict[str, tuple[str, dict[str, Any]]],
    counts: list[int],
) -> dict[str, dict[str, Any]]:
    owners = [str(s["connection_id"]["S"]).removeprefix(WORKER_KEY_PREFIX) for s in sessions] or ["w0"]
    out: dict[str, dict[str, Any]] = {}
    async with local_dynamodb(endpoint) as client:
        await LeaseTableAdmin(client, TABLE).create_table()
        for item in sessions:
            await client.put_item(TableName=TABLE, Item=item)
        present = 0
        for target in sorted(counts):
            batch = [connection_item(i, owners[i % len(owners)]) for i in range(present, target)]
            for start in range(0, len(batch), 25):
                requests: list[Any] = [{"PutRequest": {"Item": item}} for item in batch[start : start + 25]]
                await client.batch_write_item(RequestItems={TABLE: requests})
            present = target
            check = CrossCheck(client, TABLE)
            out[str(target)] = {
                kind: await check.price(op, body) for kind, (op, body) in sorted(reads.items())
            }
    return out


def listing_cost(
    sessions: list[dict[str, Any]], reads: dict[str, tuple[str, dict[str, Any]]], counts: list[int]
) -> dict[str, dict[str, Any]]:
    """{connections: {read kind: price}} for each count in `counts`."""
    dynamodb = start_dynamodb_local()
    try:
        return asyncio.run(_measure(dynamodb.url, sessions, reads, counts))
    finally:
        dynamodb.stop()
