"""A record the sink can never accept fails its connection, visibly (docs/design.md §4.4, §5, L3).

Kinesis accepts records of at most 1 MiB (data plus partition key). A frame just under the
worker's 1 MiB frame limit becomes a record over it once the envelope is added. Before, the
sink's refusal was not counted as a failure: the session resubscribed from its checkpoint, got
the same frame again and looped forever (STARTED, never delivered, never marked failed). Now the
records before it are written, and the refusal counts as a failure at that position, so the
connection is marked failed with the size in `last_error` after MAX_FAILURES_AT_POSITION
attempts. Real worker in-process, DynamoDB Local, Kinesis on moto's server.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import aioboto3
import pytest
from types_aiobotocore_dynamodb import DynamoDBClient
from types_aiobotocore_kinesis import KinesisClient
from websockets.asyncio.server import ServerConnection, serve

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.protocol.seqfeed import MAX_FRAME_BYTES
from leaseworker.settings import Settings
from leaseworker.sinks.kinesis import MAX_BYTES_PER_RECORD, KinesisSink
from leaseworker.worker.session import MAX_FAILURES_AT_POSITION
from tests.worker.harness import running
from tests.worker.integration.test_sinks import REGION, create_stream, read_stream

BIG_SEQ = 5


class BigFrameFeed:
    """seqfeed/1, contiguous from after_seq + 1, with a frame of almost MAX_FRAME_BYTES at BIG_SEQ."""

    def __init__(self) -> None:
        self.opens = 0
        self.url = ""

    async def handle(self, ws: ServerConnection) -> None:
        self.opens += 1
        seq = json.loads(await ws.recv())["after_seq"] + 1
        while seq < BIG_SEQ:
            await ws.send(json.dumps({"type": "data", "seq": seq, "data": {"n": seq}}))
            seq += 1
        head = f'{{"type":"data","seq":{seq},"data":"'
        await ws.send(head + "x" * (MAX_FRAME_BYTES - len(head) - 2) + '"}')
        await ws.wait_closed()


@pytest.fixture
async def big_feed() -> AsyncIterator[BigFrameFeed]:
    feed = BigFrameFeed()
    async with serve(feed.handle, "127.0.0.1", 0, max_size=None) as server:
        feed.url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/big"
        yield feed


@pytest.fixture
async def kinesis(moto_endpoint: str) -> AsyncIterator[KinesisClient]:
    async with aioboto3.Session().client("kinesis", endpoint_url=moto_endpoint, region_name=REGION) as client:
        yield client


async def test_a_record_over_the_sink_limit_fails_its_connection_after_delivering_what_came_before(
    ddb: DynamoDBClient, table: str, settings: Settings, kinesis: KinesisClient, big_feed: BigFrameFeed
) -> None:
    stream = f"big-{table}"
    await create_stream(kinesis, stream, shards=1)
    admin = LeaseTableAdmin(ddb, table)
    await admin.add("big", big_feed.url)
    async with running(replace(settings, sink=f"kinesis:{stream}"), sink=KinesisSink(kinesis, stream)) as run:
        started = time.monotonic()
        while True:
            item = await admin.show("big")
            if item["desired_state"] == "STOPPED" or time.monotonic() - started > 30:
                break
            await asyncio.sleep(0.2)
        assert not run.task.done(), "the worker stays up"
    assert item["desired_state"] == "STOPPED", f"still {item['desired_state']}: {item}"
    assert item["last_error"].startswith(f"failed: {MAX_FAILURES_AT_POSITION} failures at seq {BIG_SEQ - 1}")
    assert f"over the {MAX_BYTES_PER_RECORD}-byte PutRecords limit" in item["last_error"]
    assert big_feed.opens == MAX_FAILURES_AT_POSITION
    assert item["last_seq"] == BIG_SEQ - 1
    # What came before it reached the stream, in order (each at least once, none after it).
    seqs = [data["seq"] for key, data in await read_stream(kinesis, stream) if key == "big"]
    assert sorted(set(seqs)) == list(range(BIG_SEQ)), seqs
