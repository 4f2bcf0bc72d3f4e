"""Shutdown stays inside SHUTDOWN_GRACE_SECONDS even when a step hangs."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import replace

from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.records import SinkRecord
from leaseworker.settings import Settings
from leaseworker.sinks.base import Validity, always_valid
from leaseworker.worker.main import build_worker
from leaseworker_dev.feed.server import FeedServer
from tests.worker.harness import eventually


class HangingSink:
    """A sink that never acknowledges: the fault under test (no real sink can be made to hang
    on demand here). Every write blocks until it is cancelled."""

    def __init__(self) -> None:
        self.writes = 0

    async def write(self, records: Sequence[SinkRecord], *, valid: Validity = always_valid) -> None:
        self.writes += 1
        await asyncio.Event().wait()

    async def close(self) -> None:
        return None


async def test_shutdown_with_a_hanging_sink_fits_the_grace_period(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    settings = replace(settings, shutdown_grace_seconds=4.0, lease_seconds=6.0, heartbeat_seconds=1.0)
    sink = HangingSink()
    admin = LeaseTableAdmin(ddb, table)
    async with FeedServer(rate=50) as feed:
        for i in range(3):
            await admin.add(f"c{i}", feed.url_for(f"c{i}"))
        stop = asyncio.Event()
        async with AsyncExitStack() as stack:
            worker, _ = await build_worker(settings, stack, metrics_stream=io.StringIO(), sink=sink)
            task = asyncio.create_task(worker.run(stop))
            await eventually(
                lambda: len(worker.owned) == 3 and sink.writes >= 3, 10, "writes stuck in the sink"
            )
            stopped = time.monotonic()
            stop.set()
            await asyncio.wait_for(task, settings.shutdown_grace_seconds + 5)
            took = time.monotonic() - stopped
    assert took <= settings.shutdown_grace_seconds, took
    # Nothing was acknowledged, so nothing may have been checkpointed.
    for item in await admin.list():
        assert item["last_seq"] == -1, item
