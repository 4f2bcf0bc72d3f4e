"""A rebalance publishes the shedder's load before its release lands (worker/heartbeat.py).

Fair share counts each connection as a live worker's published load or as free. A worker that
sheds one connection and publishes its load only at its next heartbeat leaves a window in which
a peer's view counts that connection twice: the peer claims it above its real share and sheds
it again (the soak's churn check saw one connection bounce for seconds). Real workers,
DynamoDB Local.

The check, from the table: whenever a connection the shedder held is no longer its own, the
shedder's published load (read after) is at most what it still holds (read before).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.settings import Settings
from leaseworker_dev.feed.server import FeedServer
from tests.worker.harness import eventually, running

SHEDDER = "shedder"
IDS = [f"c{i}" for i in range(4)]


async def test_a_shed_connection_is_never_counted_twice(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    # A long heartbeat makes the stale-load window wide; rebalancing runs every half second.
    tuned = replace(settings, lease_seconds=9.0, heartbeat_seconds=3.0, reconcile_seconds=0.5, sink="null")
    admin = LeaseTableAdmin(ddb, table)
    violations: list[str] = []
    sheds_seen: set[str] = set()

    async def watch() -> None:
        while True:
            connections = await admin.list()  # read first: what the shedder still holds
            held = [c["connection_id"] for c in connections if c.get("lease_owner") == SHEDDER]
            session = await admin.raw_item(f"worker#{SHEDDER}")  # read after
            load = int(session["load"]) if session else 0
            gone = set(IDS) - set(held)
            if len(held) < len(IDS):
                sheds_seen.update(gone)
                if load > len(held):
                    violations.append(f"holds {held}, published load {load}")
            await asyncio.sleep(0.02)

    async with FeedServer() as feed:
        for cid in IDS:
            await admin.add(cid, feed.url_for(cid))
        async with running(replace(tuned, worker_id=SHEDDER)) as shedder:
            await eventually(lambda: len(shedder.worker.owned) == len(IDS), 10, "the shedder owning all")
            watcher = asyncio.create_task(watch())
            try:
                async with running(replace(tuned, worker_id="newcomer")) as newcomer:
                    await eventually(
                        lambda: len(shedder.worker.owned) == 2 and len(newcomer.worker.owned) == 2,
                        20,
                        "two connections each",
                    )
                    await asyncio.sleep(1.0)
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
    assert len(sheds_seen) >= 2, "the shedder handed back fewer than two connections"
    assert not violations, violations[:5]


async def test_a_newcomer_never_claims_above_its_share_while_the_shedder_hands_back(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    """The other side of the same window (worker/app.py `_fleet_view`): the newcomer's view
    must not pair a fresh count of free connections with a listing from before the release,
    which still holds the released connection as the shedder's load. With a heartbeat six times
    the reconcile period, that stale pairing showed the newcomer a share of 3 of 4 connections:
    it claimed a third and handed it back (a bounce)."""
    tuned = replace(settings, lease_seconds=9.0, heartbeat_seconds=3.0, reconcile_seconds=0.5, sink="null")
    admin = LeaseTableAdmin(ddb, table)
    most = 0

    async with FeedServer() as feed:
        for cid in IDS:
            await admin.add(cid, feed.url_for(cid))
        async with running(replace(tuned, worker_id=SHEDDER)) as shedder:
            await eventually(lambda: len(shedder.worker.owned) == len(IDS), 10, "the shedder owning all")
            async with running(replace(tuned, worker_id="newcomer")) as newcomer:

                def balanced() -> bool:
                    nonlocal most
                    most = max(most, len(newcomer.worker.owned) + len(newcomer.worker.claiming))
                    return len(shedder.worker.owned) == 2 and len(newcomer.worker.owned) == 2

                await eventually(balanced, 20, "two connections each")
                for _ in range(30):  # and it stays so
                    balanced()
                    await asyncio.sleep(0.1)
    assert most <= len(IDS) // 2, f"the newcomer held or claimed {most} of {len(IDS)} at once"
