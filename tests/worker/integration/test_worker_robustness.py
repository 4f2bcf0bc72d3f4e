"""The worker's loops under slow DynamoDB, uneven capacities and malformed items (real worker,
DynamoDB Local)."""

from __future__ import annotations

import asyncio
import io
from contextlib import AsyncExitStack
from dataclasses import replace

import pytest
from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.observability.metrics import MetricName
from leaseworker.settings import Settings
from leaseworker.worker.main import build_worker
from leaseworker_dev.feed.server import FeedServer
from leaseworker_dev.local.proxy import TcpProxy
from tests.worker.harness import eventually, running


async def round_trip(endpoint: str, table: str) -> float:
    """One GetItem's round trip through `endpoint`, in seconds."""
    import time

    import aioboto3

    async with aioboto3.Session().client(
        "dynamodb", endpoint_url=endpoint, region_name="us-east-1"
    ) as client:
        started = time.monotonic()
        await client.get_item(TableName=table, Key={"connection_id": {"S": "c0"}})
        return time.monotonic() - started


async def test_round_trips_of_a_third_of_the_lease_fence_no_lease(
    ddb: DynamoDBClient, table: str, settings: Settings, dynamodb_proxy: TcpProxy
) -> None:
    """Every DynamoDB round trip takes about LEASE_SECONDS / 3 (one heartbeat): no lease is lost."""
    admin = LeaseTableAdmin(ddb, table)
    settings = replace(settings, sink="null", endpoint_url=dynamodb_proxy.url)
    async with FeedServer() as feed:
        for i in range(12):
            await admin.add(f"c{i}", feed.url_for(f"c{i}"))
        async with running(settings) as run:
            await eventually(lambda: len(run.worker.owned) == 12, 15, "all owned")
            # The proxy delays every chunk it forwards; a request and its reply are a few chunks.
            dynamodb_proxy.latency = settings.lease_seconds / 8
            rtt = await round_trip(dynamodb_proxy.url, table)
            print(f"DynamoDB round trip through the proxy: {rtt:.2f} s (lease {settings.lease_seconds} s)")
            assert rtt >= settings.lease_seconds / 4, f"the fault is too mild to mean anything: {rtt:.2f} s"
            await asyncio.sleep(4 * settings.lease_seconds)
            dynamodb_proxy.latency = 0.0
            totals = run.metrics.totals()
            assert len(run.worker.owned) == 12
    assert totals.get(MetricName.LeasesLost, 0) == 0
    assert totals.get(MetricName.SelfFenced, 0) == 0
    epochs = {item["connection_id"]: item["lease_epoch"] for item in await admin.list()}
    assert set(epochs.values()) == {1}, epochs


async def test_uneven_capacities_leave_nothing_unowned(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    """Two workers capped at 5 and 100 with 12 connections: all 12 owned (5 + 7)."""
    admin = LeaseTableAdmin(ddb, table)
    small = replace(settings, sink="null", worker_id="small", max_connections=5)
    big = replace(settings, sink="null", worker_id="big", max_connections=100)
    async with FeedServer() as feed:
        for i in range(12):
            await admin.add(f"c{i}", feed.url_for(f"c{i}"))
        async with running(small) as first:
            await eventually(lambda: len(first.worker.owned) == 5, 10, "the small worker full")
            async with running(big) as second:
                await eventually(
                    lambda: len(first.worker.owned) + len(second.worker.owned) == 12, 15, "all 12 owned"
                )
                await asyncio.sleep(3 * settings.reconcile_seconds)  # and it stays that way
                assert len(first.worker.owned) == 5 and len(second.worker.owned) == 7


async def test_malformed_owned_item_seen_by_a_hint_is_marked_failed(
    ddb: DynamoDBClient, table: str, settings: Settings, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import aioboto3

    from leaseworker.notify import Notifier

    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", moto_endpoint)
    admin = LeaseTableAdmin(ddb, table)
    async with aioboto3.Session().client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1") as sqs:
        queue_url = (await sqs.create_queue(QueueName=f"hints-{table}"))["QueueUrl"]
        settings = replace(settings, sink="null", notify_queue_url=queue_url)
        async with FeedServer() as feed:
            await admin.add("c1", feed.url_for("c1"))
            async with running(settings) as run:
                await eventually(lambda: "c1" in run.worker.owned, 10, "c1 owned")
                await ddb.update_item(
                    TableName=table,
                    Key={"connection_id": {"S": "c1"}},
                    UpdateExpression="SET ws_url = :n",
                    ExpressionAttributeValues={":n": {"N": "7"}},
                )
                await Notifier(sqs, queue_url).connection_changed("c1")
                await eventually(lambda: "c1" not in run.worker.owned, 10, "c1 dropped")
                assert not run.task.done(), "a malformed item must not take the worker down"
                await asyncio.sleep(2 * settings.reconcile_seconds)
                assert "c1" not in run.worker.owned
    item = await admin.show("c1")
    assert item["desired_state"] == "STOPPED" and str(item["last_error"]).startswith("failed:"), item


async def test_claims_in_flight_at_shutdown_are_released(
    ddb: DynamoDBClient, table: str, settings: Settings, dynamodb_proxy: TcpProxy
) -> None:
    """SIGTERM while acquires are on the wire: whatever they won is released before exit."""
    admin = LeaseTableAdmin(ddb, table)
    settings = replace(settings, sink="null", endpoint_url=dynamodb_proxy.url)
    async with FeedServer() as feed:
        for i in range(8):
            await admin.add(f"c{i}", feed.url_for(f"c{i}"))
        dynamodb_proxy.latency = 0.3
        stop = asyncio.Event()
        async with AsyncExitStack() as stack:
            worker, _ = await build_worker(settings, stack, metrics_stream=io.StringIO())
            task = asyncio.create_task(worker.run(stop))
            await eventually(lambda: bool(worker.claiming), 10, "claims in flight")
            stop.set()
            await asyncio.wait_for(task, 15)
        assert not worker.owned and not worker.claiming
        items = await admin.list()
    held = [item["connection_id"] for item in items if item.get("lease_owner")]
    assert held == [], f"claimed during shutdown and never released: {held}"
