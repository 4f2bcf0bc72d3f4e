"""A reconcile claims in batches until it is full (worker/acquirer.py).

One query's candidates are shared with the peers reconciling at once: at a cold start every
worker reads the same first items of the index and they race for them. A reconcile that stopped
after one batch left its remaining share free for a whole period (P6's cold start stood idle for
seconds at a time). Here a rival claims most of the first batch's candidates between our query
and our claims; the worker must still fill its share in the same reconcile, long before its next
one (60 s away). Real worker, real rival writes, DynamoDB Local.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from dataclasses import replace

from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.connection_store import ConnectionStore
from leaseworker.lease.ownership import Ownership
from leaseworker.lease.results import Acquired
from leaseworker.settings import Settings
from leaseworker.worker.main import build_worker
from leaseworker_dev.feed.server import FeedServer
from tests.worker.harness import eventually

CAPACITY = 10
FREE = 4 * CAPACITY
RIVAL_TAKES = 15  # of the first batch's 2 × CAPACITY candidates: we can win at most 5 of them


class RacedFirstQuery:
    """The worker's real Ownership; its first candidate query is raced by a rival's claims."""

    def __init__(self, inner: Ownership, rival: ConnectionStore) -> None:
        self._inner = inner
        self._rival = rival
        self.queries = 0
        self.rival_won = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def find_claimable(self, limit: int) -> list[str]:
        found = await self._inner.find_claimable(limit)
        self.queries += 1
        if self.queries == 1:
            results = [await self._rival.acquire(cid, "rival") for cid in found[:RIVAL_TAKES]]
            self.rival_won = sum(isinstance(r, Acquired) for r in results)
        return found


async def test_a_reconcile_fills_its_share_when_peers_win_most_of_a_batch(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    # One reconcile at start; the next one is at least 48 s away.
    tuned = replace(
        settings, lease_mode="connection", max_connections=CAPACITY, reconcile_seconds=60.0, sink="null"
    )
    admin = LeaseTableAdmin(ddb, table)
    rival = ConnectionStore(ddb, replace(tuned, worker_id="rival"))
    async with FeedServer() as feed, AsyncExitStack() as stack:
        for i in range(FREE):
            await admin.add(f"c{i:02d}", feed.url_for(f"c{i:02d}"))
        worker, _ = await build_worker(tuned, stack)
        raced = RacedFirstQuery(worker._acquirer._ownership, rival)
        worker._acquirer._ownership = raced  # type: ignore[assignment]
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        try:
            await eventually(lambda: len(worker.owned) == CAPACITY, 15, f"the worker owning {CAPACITY}")
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)
    assert raced.rival_won == RIVAL_TAKES
    # Filled within the one reconcile: by the first batch itself since a claim lost to the
    # rival hands its slot to the next candidate (acquirer._claim_some), else by a second batch.
    assert raced.queries >= 1
