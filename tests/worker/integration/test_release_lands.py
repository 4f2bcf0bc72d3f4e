"""Session mode: a release that fails is retried until it lands, its checkpoint entry is kept
meanwhile, and an upstream's stale_epoch hands the lease back (review 2026-12-05, B, C2, E).

A session-held item never expires: any path that drops a lease without a release that lands
leaves it named by our live session, unserved for the worker's lifetime; and any checkpoint
round that drops its entry leaves a successor only the claim-time `last_seq`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

from types_aiobotocore_dynamodb import DynamoDBClient
from websockets.asyncio.client import connect

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.observability.metrics import MetricName
from leaseworker.settings import Settings
from leaseworker_dev.feed.server import FeedServer
from tests.worker.harness import eventually, running
from tests.worker.lost_reply import Refusals, releases_of

REFUSED_RELEASES = 5  # the old code gave up after 4 attempts ("left to expire")


async def test_a_refused_release_is_retried_until_it_lands_and_keeps_its_checkpoint_entry(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    settings = replace(settings, sink="null", lease_mode="session")
    admin = LeaseTableAdmin(ddb, table)
    refusals: list[Refusals] = []

    def wrap(client: DynamoDBClient) -> DynamoDBClient:
        refusals.append(Refusals(client, match=releases_of("c0")))
        return refusals[0].as_client()

    async with FeedServer(rate=50) as feed:
        for cid in ("c0", "c1"):
            await admin.add(cid, feed.url_for(cid))
        async with running(settings, wrap_dynamodb=wrap) as run:
            await eventually(lambda: run.worker.owned == ["c0", "c1"], 10, "both owned")

            async def checkpoint_of_c0() -> int:
                return int(next(i for i in await admin.list() if i["connection_id"] == "c0")["checkpoint"])

            async def checkpointed() -> bool:
                return await checkpoint_of_c0() > 0

            await eventually(checkpointed, 10, "a batched checkpoint of c0")
            refusals[0].remaining = REFUSED_RELEASES
            await admin.stop("c0")
            before = await checkpoint_of_c0()
            # While the release is refused, c1 keeps advancing: every round rewrites the map.
            lowest = before
            for _ in range(40):
                lowest = min(lowest, await checkpoint_of_c0())
                item = next(i for i in await admin.list() if i["connection_id"] == "c0")
                if "lease_owner" not in item:
                    break
                await asyncio.sleep(0.2)
            assert lowest >= before, f"C2: c0's effective checkpoint moved back {before} -> {lowest}"
            assert refusals[0].refused == REFUSED_RELEASES
            item = next(i for i in await admin.list() if i["connection_id"] == "c0")
            assert "lease_owner" not in item, f"B: the release was given up: {item}"
            assert item["last_seq"] >= before, item
            assert run.worker.owned == ["c1"]


async def test_an_upstream_stale_epoch_hands_the_lease_back(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    settings = replace(settings, sink="null", lease_mode="session")
    admin = LeaseTableAdmin(ddb, table)
    async with FeedServer(rate=20, kick_stale=True) as feed:
        await admin.add("c0", feed.url_for("c0"))
        async with running(settings) as run:
            await eventually(lambda: feed.highest_epoch("c0") == 1, 10, "c0 subscribed at epoch 1")
            # Another party subscribes at epoch 3: the upstream kicks epoch 1 with stale_epoch,
            # and refuses epoch 2 too. The item names our session at epoch 1 all along.
            async with connect(feed.url_for("c0")) as intruder:
                subscribe = {"type": "subscribe", "connection_id": "c0", "after_seq": -1, "epoch": 3}
                await intruder.send(json.dumps(subscribe | {"worker_id": "intruder"}))
                await intruder.recv()

            async def served_again() -> bool:
                [item] = await admin.list()
                mine = item.get("lease_owner") == settings.worker_id
                return mine and item["lease_epoch"] >= 3 and run.worker.owned == ["c0"]

            # Handed back and claimed again until the epoch passes the upstream's: well within
            # the audit's period, so it is the hand-back that does it, not the safety net.
            await eventually(served_again, 8, "c0 handed back and served again at epoch >= 3")
            assert run.metrics.totals().get(MetricName.LeasesRepaired, 0) == 0
