"""Reaping a fenced session is judged on the reaper's own monotonic clock (review 2026-12-05, D).

`fenced_at_ms` is written with another host's wall clock, and `owned_by` reads a lagging index:
a reaper whose clock runs ahead (or a fence stamped by a clock behind) reaped at once, and a claim
of the dead worker's that landed or was indexed a moment later was then held by a session that
no longer existed, with no way to free it. Now a session is reaped only after it held nothing on
listings REAP_AFTER_LEASES lease periods apart on our own clock."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease.attribute_values import session_key
from leaseworker.lease.liveness import CONFIRMED
from leaseworker.lease.session_store import SessionStore
from leaseworker.settings import Settings
from leaseworker.worker.peers import REAP_AFTER_LEASES
from tests.worker.harness import eventually, running

DEAD = "dead-worker"


async def test_a_fence_stamped_long_ago_by_another_clock_is_not_reaped_at_once(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    settings = replace(settings, sink="null", lease_mode="session")
    sessions = SessionStore(ddb, table)
    await sessions.heartbeat(DEAD, load=0, capacity=10, lease_mode="session")
    assert await sessions.fence(DEAD, seen_hb=None, me="supervisor", kind=CONFIRMED, reason="exited")
    await ddb.update_item(  # as a fencer whose wall clock runs an hour behind ours stamped it
        TableName=table,
        Key=session_key(DEAD),
        UpdateExpression="SET fenced_at_ms = fenced_at_ms - :hour",
        ExpressionAttributeValues={":hour": {"N": "3600000"}},
    )

    async def session_exists() -> bool:
        response = await ddb.get_item(TableName=table, Key=session_key(DEAD), ConsistentRead=True)
        return "Item" in response

    async with running(settings):
        await asyncio.sleep(2 * settings.heartbeat_seconds)  # a few listings, well inside 2 L
        assert await session_exists(), "reaped on another host's wall-clock age"

        async def reaped() -> bool:
            return not await session_exists()

        wait = REAP_AFTER_LEASES * settings.lease_seconds + 3 * settings.heartbeat_seconds
        await eventually(reaped, wait, "the empty fenced session reaped on our own clock")
