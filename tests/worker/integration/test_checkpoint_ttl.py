"""The checkpoint item's TTL cannot delete a live worker's checkpoints (review 2026-12-05, C3).

A write sets `purge_at`; writes used to happen only when some checkpoint advanced, so a worker
whose feeds all stayed idle for longer than the TTL (a market holiday) lost its only fresh
checkpoints to DynamoDB's TTL, and a crash then replayed from claim time. DynamoDB Local does
not run TTL, so the test checks the cause: `purge_at` is refreshed while anything is held, on a
feed that never sends anything, at the refresh period (shortened here)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease import session_leases
from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.attribute_values import PURGE_AFTER_SECONDS, checkpoint_key
from leaseworker.settings import Settings
from leaseworker_dev.feed.server import FeedServer
from tests.worker.harness import eventually, running

REFRESH_SECONDS = 1.5


def test_the_refresh_period_leaves_the_ttl_three_chances() -> None:
    assert 3 * session_leases.CHECKPOINT_REFRESH_SECONDS < PURGE_AFTER_SECONDS


async def test_an_idle_workers_checkpoint_item_has_its_ttl_refreshed(
    ddb: DynamoDBClient, table: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_leases, "CHECKPOINT_REFRESH_SECONDS", REFRESH_SECONDS, raising=False)
    settings = replace(settings, sink="null", lease_mode="session")
    admin = LeaseTableAdmin(ddb, table)

    async def purge_at() -> int | None:
        key = checkpoint_key(settings.worker_id)
        item = (await ddb.get_item(TableName=table, Key=key, ConsistentRead=True)).get("Item")
        return int(item["purge_at"]["N"]) if item and "purge_at" in item else None

    async with FeedServer(rate=0) as feed:  # idle: no checkpoint ever advances
        await admin.add("c0", feed.url_for("c0"))
        async with running(settings) as run:
            await eventually(lambda: run.worker.owned == ["c0"], 10, "c0 owned")

            async def written() -> bool:
                return await purge_at() is not None

            await eventually(written, 3 * settings.checkpoint_seconds, "the checkpoint item written")
            first = await purge_at()
            assert first is not None
            await asyncio.sleep(REFRESH_SECONDS + 2 * settings.checkpoint_seconds)
            later = await purge_at()
            assert later is not None and later > first, (first, later)
