"""A poison frame at one position is not bounced forever (issue 20, docs/design.md §3, §4.4, L3).

A seqfeed/1 upstream that sends a frame nested 100,000 deep at the same seq on every connection
can never be delivered: seqfeed/1 frames must be JSON the worker accepts. The worker keeps the
lease, backs off, records `last_error`, and after MAX_FAILURES_AT_POSITION failures with
nothing delivered in between marks the connection failed. The stated bound: 5 connection
attempts, whose backoff adds up to at most 0.2 + 0.4 + 0.8 + 1.6 = 3 s (equal jitter), so about
4 s with the connects; the test allows 20 s on a loaded machine.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from types_aiobotocore_dynamodb import DynamoDBClient
from websockets.asyncio.server import ServerConnection, serve

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.settings import Settings
from leaseworker.worker.session import MAX_FAILURES_AT_POSITION
from leaseworker_dev.local.invariants import read_sink
from tests.worker.harness import running

POISON_SEQ = 5
DEEP = 100_000


class PoisonFeed:
    """seqfeed/1, contiguous from after_seq + 1, with the same poison at POISON_SEQ every time."""

    def __init__(self) -> None:
        self.opens = 0
        self.url = ""

    async def handle(self, ws: ServerConnection) -> None:
        self.opens += 1
        subscribe = json.loads(await ws.recv())
        seq = subscribe["after_seq"] + 1
        while seq < POISON_SEQ:
            await ws.send(json.dumps({"type": "data", "seq": seq, "data": {"n": seq}}))
            seq += 1
        await ws.send(f'{{"type":"data","seq":{seq},"data":{"[" * DEEP}{"]" * DEEP}}}')
        await ws.wait_closed()


@pytest.fixture
async def poison() -> AsyncIterator[PoisonFeed]:
    feed = PoisonFeed()
    async with serve(feed.handle, "127.0.0.1", 0, max_size=None) as server:
        feed.url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/poison"
        yield feed


async def test_a_poison_frame_at_one_position_fails_the_connection_within_the_bound(
    ddb: DynamoDBClient, table: str, settings: Settings, tmp_path: Path, poison: PoisonFeed
) -> None:
    admin = LeaseTableAdmin(ddb, table)
    await admin.add("poisoned", poison.url)
    settings = replace(settings, sink=f"file:{tmp_path}")
    async with running(settings) as run:
        started = time.monotonic()
        while True:
            item = await admin.show("poisoned")
            if item["desired_state"] == "STOPPED" or time.monotonic() - started > 20:
                break
            await asyncio.sleep(0.2)
        took = time.monotonic() - started
        assert not run.task.done(), "the worker stays up"
    assert item["desired_state"] == "STOPPED", f"still {item['desired_state']} after {took:.1f} s: {item}"
    assert item["last_error"].startswith(
        f"failed: {MAX_FAILURES_AT_POSITION} failures at seq {POISON_SEQ - 1}"
    )
    assert "too_deep" in item["last_error"]
    assert "lease_owner" not in item
    # It was not bounced: one worker, the stated number of attempts, and what came before the
    # poison was delivered once and checkpointed.
    assert poison.opens == MAX_FAILURES_AT_POSITION
    assert item["last_seq"] == POISON_SEQ - 1
    delivered = [r.seq for r in read_sink(tmp_path).get("poisoned", [])]
    assert delivered == list(range(POISON_SEQ)), delivered
