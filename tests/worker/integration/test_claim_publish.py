"""A claim shows in the worker's published load within CLAIM_PUBLISH_SECONDS, not at its next
heartbeat (worker/heartbeat.py `publish_soon`).

Until then peers count the claimed connection neither as free nor as this worker's load, so
every view they take underestimates the fleet: after a death each survivor saw a share its peers'
claims had already filled and stopped short. Real worker, DynamoDB Local; the heartbeat is six
seconds, so only the publish after claims can show the load sooner.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.settings import Settings
from leaseworker_dev.feed.server import FeedServer
from tests.worker.harness import eventually, running

IDS = [f"c{i}" for i in range(5)]


async def test_claims_are_published_long_before_the_next_heartbeat(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    tuned = replace(settings, lease_seconds=18.0, heartbeat_seconds=6.0, reconcile_seconds=1.0, sink="null")
    admin = LeaseTableAdmin(ddb, table)

    async def published() -> int:
        session = await admin.raw_item(f"worker#{tuned.worker_id}")
        return int(session["load"]) if session else -1

    async with FeedServer() as feed:
        for cid in IDS:
            await admin.add(cid, feed.url_for(cid))
        async with running(tuned) as worker:
            await eventually(lambda: len(worker.worker.owned) == len(IDS), 10, "the worker owning all")
            owned_at = time.monotonic()
            while await published() != len(IDS):
                assert time.monotonic() - owned_at < 2.0, "the claims were not published within 2 s"
                await asyncio.sleep(0.05)
