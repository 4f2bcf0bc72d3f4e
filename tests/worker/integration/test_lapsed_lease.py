"""Session mode: a lease lost to our own deadline while our session was never fenced.

In session mode a connection item is held by the session item, not by an expiring lease, so a
worker whose local deadline passed (here: DynamoDB unreachable for longer than the lease, with
no peer to fence it) must hand the item back once DynamoDB answers again. Otherwise the item
names a live session that no longer serves it, and nobody ever takes it over (found by the fault
suite as an 11 s L1 and a checkpoint that moved back when the orphan was finally taken over).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.observability.metrics import MetricName
from leaseworker.settings import Settings
from leaseworker_dev.feed.server import FeedServer
from leaseworker_dev.local.proxy import TcpProxy
from tests.worker.harness import eventually, running


async def test_a_lapsed_session_held_lease_is_handed_back_and_claimed_again(
    ddb: DynamoDBClient, table: str, settings: Settings, dynamodb_proxy: TcpProxy
) -> None:
    settings = replace(settings, sink="null", endpoint_url=dynamodb_proxy.url, lease_mode="session")
    admin = LeaseTableAdmin(ddb, table)
    ids = ["c0", "c1"]
    async with FeedServer(rate=50) as feed:
        for cid in ids:
            await admin.add(cid, feed.url_for(cid))
        async with running(settings) as run:
            await eventually(lambda: run.worker.owned == ids, 10, "both owned")
            await asyncio.sleep(2 * settings.checkpoint_seconds)  # a batched checkpoint landed
            before = {item["connection_id"]: item["checkpoint"] for item in await admin.list()}
            assert all(seq >= 0 for seq in before.values()), before
            dynamodb_proxy.set_mode("blackhole")
            await eventually(
                lambda: run.metrics.totals().get(MetricName.SelfFenced, 0) >= len(ids),
                3 * settings.lease_seconds,
                "both leases lapsed",
            )
            dynamodb_proxy.set_mode("pass")

            async def reclaimed() -> bool:
                items = await admin.list()
                mine = [i for i in items if i.get("lease_owner") == settings.worker_id]
                return len(mine) == len(items) and all(i["lease_epoch"] >= 2 for i in mine)

            deadline = asyncio.get_running_loop().time() + 4 * settings.lease_seconds
            while not await reclaimed():
                assert asyncio.get_running_loop().time() < deadline, await admin.list()
                await asyncio.sleep(0.2)
            assert sorted(run.worker.owned) == ids
        after = {item["connection_id"]: item["checkpoint"] for item in await admin.list()}
    for cid in ids:  # handed back with what the sink accepted: the checkpoint never moved back
        assert after[cid] >= before[cid], (cid, before, after)
