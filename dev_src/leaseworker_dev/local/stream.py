"""Read a (moto) Kinesis stream the way S1 is judged: in shard order, one arbiter per connection.

The test-side counterpart of leaseworker.stream_reader.read_stream: it returns what reached the
stream as `Delivered` records in arrival order, ready for leaseworker_dev.local.invariants.
"""

from __future__ import annotations

import asyncio

import aioboto3

from leaseworker.aws import CLI_CLIENT_CONFIG
from leaseworker.stream_reader import read_stream
from leaseworker_dev.local.invariants import Delivered

DEFAULT_REGION = "us-east-1"


async def read_arrivals(
    endpoint_url: str, stream_name: str, *, region: str = DEFAULT_REGION
) -> list[Delivered]:
    """Every sink record in the stream, in the order Kinesis accepted it (per shard)."""
    session = aioboto3.Session()
    async with session.client(
        "kinesis", endpoint_url=endpoint_url, region_name=region, config=CLI_CLIENT_CONFIG
    ) as client:
        return [delivered(entry.record) async for entry in read_stream(client, stream_name)]


def read_arrivals_sync(
    endpoint_url: str, stream_name: str, *, region: str = DEFAULT_REGION
) -> list[Delivered]:
    """read_arrivals() for synchronous code (the system tests, the local scenario)."""
    return asyncio.run(read_arrivals(endpoint_url, stream_name, region=region))


def delivered(record: dict[str, object]) -> Delivered:
    return Delivered(
        str(record["connection_id"]),
        int(str(record["seq"])),
        int(str(record["epoch"])),
        str(record["worker_id"]),
        int(str(record["received_at_ms"])),
    )
