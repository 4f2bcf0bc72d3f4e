"""The control plane against a real worker: capacity, STOPPED, SQS hints, graceful release."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import aioboto3
import pytest
from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.notify import Notifier
from leaseworker.settings import Settings
from leaseworker_dev.feed.server import FeedServer
from leaseworker_dev.local.invariants import read_events, read_sink
from tests.worker.harness import eventually, running


async def test_max_connections_is_honoured(
    ddb: DynamoDBClient, table: str, settings: Settings, tmp_path: Path
) -> None:
    settings = replace(settings, max_connections=3, sink="null")
    admin = LeaseTableAdmin(ddb, table)
    async with FeedServer() as feed:
        for i in range(5):
            await admin.add(f"c{i}", feed.url_for(f"c{i}"))
        async with running(settings) as run:
            await eventually(lambda: len(run.worker.owned) == 3, 10, "three connections owned")
            await asyncio.sleep(2.5)  # several reconcile rounds later, still three
            assert len(run.worker.owned) == 3
        owners = [item.get("lease_owner") for item in await admin.list()]
    assert owners.count(None) >= 2


async def test_stopped_connection_is_closed_and_released(
    ddb: DynamoDBClient, table: str, settings: Settings, tmp_path: Path
) -> None:
    sink_dir = tmp_path / "sink"
    settings = replace(settings, sink=f"file:{sink_dir}")
    admin = LeaseTableAdmin(ddb, table)
    log = tmp_path / "feed.jsonl"
    async with FeedServer(rate=50, session_log=log) as feed:
        await admin.add("c1", feed.url_for("c1"))
        async with running(settings) as run:
            await eventually(lambda: "c1" in run.worker.owned, 10, "c1 owned")
            await asyncio.sleep(1.5)
            stopped_at = time.monotonic()
            await admin.stop("c1")
            # No SQS here: the next renewal (conditioned on STARTED) notices the stop.
            await eventually(lambda: "c1" not in run.worker.owned, 5, "c1 released")
            took = time.monotonic() - stopped_at
            item = await admin.show("c1")
            await asyncio.sleep(1.5)
            assert "c1" not in run.worker.owned, "a STOPPED connection must not be re-acquired"
    assert took <= settings.heartbeat_seconds + 1.0
    assert (
        item["desired_state"] == "STOPPED" and "lease_owner" not in item and item["lease_expires_at_ms"] == 0
    )
    delivered = max(record.seq for record in read_sink(sink_dir)["c1"])
    assert item["last_seq"] == delivered  # the release carried the final checkpoint
    closes = [e for e in read_events(log) if e["event"] == "close" and e["connection_id"] == "c1"]
    assert closes and closes[-1]["code"] == 1001


async def test_sqs_hint_is_the_fast_path(
    ddb: DynamoDBClient, table: str, settings: Settings, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", moto_endpoint)
    session = aioboto3.Session()
    async with session.client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1") as sqs:
        queue_url = (await sqs.create_queue(QueueName=f"hints-{table}"))["QueueUrl"]
        # Reconcile so rarely that only the hint can explain a quick pickup.
        slow = replace(settings, reconcile_seconds=60.0, notify_queue_url=queue_url, sink="null")
        admin = LeaseTableAdmin(ddb, table)
        async with FeedServer() as feed, running(slow) as run:
            await asyncio.sleep(1.0)  # past the first (immediate) reconcile
            await admin.add("hinted", feed.url_for("hinted"))
            added = time.monotonic()
            await Notifier(sqs, queue_url).connection_changed("hinted")
            await eventually(lambda: "hinted" in run.worker.owned, 10, "the hinted connection owned")
            assert time.monotonic() - added < 5.0


async def test_graceful_shutdown_releases_everything_with_final_checkpoints(
    ddb: DynamoDBClient, table: str, settings: Settings, tmp_path: Path
) -> None:
    sink_dir = tmp_path / "sink"
    settings = replace(settings, sink=f"file:{sink_dir}", checkpoint_seconds=30.0)  # only release checkpoints
    admin = LeaseTableAdmin(ddb, table)
    async with FeedServer(rate=50) as feed:
        for i in range(4):
            await admin.add(f"c{i}", feed.url_for(f"c{i}"))
        async with running(settings) as run:
            await eventually(lambda: len(run.worker.owned) == 4, 10, "all owned")
            await asyncio.sleep(1.5)
        items = {item["connection_id"]: item for item in await admin.list()}
    records = read_sink(sink_dir)
    for cid, item in items.items():
        assert "lease_owner" not in item and item["lease_expires_at_ms"] == 0, item
        assert item["last_seq"] == max(record.seq for record in records[cid])
