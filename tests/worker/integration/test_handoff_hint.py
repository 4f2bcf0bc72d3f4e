"""A leaving worker's release is a handoff hint: a worker that counts itself full by its fair
share still claims it (up to MAX_CONNECTIONS), and a plain hint it has no room for is not
claimed (notify.py, worker/hints.py). Real worker, DynamoDB Local, moto's SQS.

The worker is made "full" the way a handoff makes survivors full: a peer's published load that
counts a connection twice (here a peer session whose load is 1 while it holds nothing), so the
worker's share is 3 of 5 while it holds 3.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace

import aioboto3
import pytest
from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.session_store import SessionStore
from leaseworker.notify import Notifier
from leaseworker.settings import Settings
from leaseworker.worker.acquirer import SHARE_REFRESH_SECONDS
from leaseworker_dev.feed.server import FeedServer
from tests.worker.harness import eventually, running

PEER = "peer-with-stale-load"


@contextlib.asynccontextmanager
async def live_peer(ddb: DynamoDBClient, table: str, *, load: int) -> AsyncIterator[None]:
    """A peer session that beats twice a second with a fixed published load."""
    sessions = SessionStore(ddb, table)

    async def beat() -> None:
        while True:
            await sessions.heartbeat(PEER, load=load, capacity=1000, lease_mode="session")
            await asyncio.sleep(0.5)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.parametrize("handoff", [True, False], ids=["handoff", "plain"])
async def test_a_full_worker_claims_a_handoff_hint_only(
    ddb: DynamoDBClient,
    table: str,
    settings: Settings,
    moto_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    handoff: bool,
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", moto_endpoint)
    session = aioboto3.Session()
    async with session.client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1") as sqs:
        queue_url = (await sqs.create_queue(QueueName=f"handoff-{table}"))["QueueUrl"]
        # Reconcile so rarely that only the hint can explain a claim.
        slow = replace(settings, reconcile_seconds=60.0, notify_queue_url=queue_url, sink="null")
        admin = LeaseTableAdmin(ddb, table)
        async with FeedServer() as feed:
            for i in range(3):
                await admin.add(f"c{i}", feed.url_for(f"c{i}"))
            async with running(slow) as run:
                await eventually(lambda: len(run.worker.owned) == 3, 10, "all three owned")
                async with live_peer(ddb, table, load=1):
                    await eventually(lambda: PEER in run.worker.peers, 10, "the peer in the worker's view")
                    # A connection a leaving worker has just released (or, plain, one just added).
                    await admin.add("h", feed.url_for("h"))
                    await Notifier(sqs, queue_url).connection_changed("h", handoff=handoff)
                    if handoff:
                        await eventually(lambda: "h" in run.worker.owned, 5, "the handed-off one owned")
                        assert len(run.worker.owned) == 4  # above its share of 3: MAX_CONNECTIONS binds
                    else:
                        # Full by its share: it passes the hint on (to itself, here) at most
                        # PASS_ON_LIMIT times and claims nothing until a reconcile.
                        await asyncio.sleep(3.0)
                        assert run.worker.owned == ["c0", "c1", "c2"]
                        assert "h" not in run.worker.claiming


async def test_a_leaving_worker_leaves_no_poll_behind_to_swallow_hints(
    ddb: DynamoDBClient, table: str, settings: Settings, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long poll cancelled by a worker's exit goes on waiting in the queue's server and takes
    the next hints, which then stay invisible for the visibility timeout: in a scale-in the
    first leaver's abandoned poll took the second leaver's hints (a 1.88 s handoff). A leaving
    worker now lets its last poll end and passes on what it brings. Reconcile is 60 s here, so
    only a hint can explain the peer's claims. The hints are spaced by more than the share
    refresh (SHARE_REFRESH_SECONDS): closer ones are judged by a view older than themselves, and
    the lone worker claims some and passes the others on (a known limit, not this test's)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", moto_endpoint)
    session = aioboto3.Session()
    async with session.client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1") as sqs:
        queue_url = (await sqs.create_queue(QueueName=f"drain-{table}"))["QueueUrl"]
        slow = replace(settings, reconcile_seconds=60.0, notify_queue_url=queue_url, sink="null")
        admin = LeaseTableAdmin(ddb, table)
        ids = [f"c{i}" for i in range(4)]
        async with FeedServer() as feed, running(replace(slow, worker_id="stays")) as stays:
            async with running(replace(slow, worker_id="leaves")):
                await eventually(lambda: "leaves" in stays.worker.peers, 10, "the peer seeing the leaver")
                await asyncio.sleep(1.0)  # both workers long-polling
            # `leaves` has exited. Now connections appear, each with its hint.
            for cid in ids:
                await admin.add(cid, feed.url_for(cid))
                await Notifier(sqs, queue_url).connection_changed(cid)
                await asyncio.sleep(SHARE_REFRESH_SECONDS + 0.05)
            await eventually(lambda: set(stays.worker.owned) == set(ids), 4, "every connection claimed")
