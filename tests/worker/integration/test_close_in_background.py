"""A session that stopped reading a busy socket does not wait for its close handshake
(worker/upstream.py BackgroundCloses).

The feed below sends 2,000 records a second. Once a sink write fails, the session stops reading
that socket: its receive queue fills, and the feed's answer to our close frame waits behind the
queued frames until the close times out (2 s). The reconnect, and at shutdown the release a
graceful handoff waits for, must not wait for that: the socket closes in the background, and
the worker's exit still sees it closed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.records import SinkRecord
from leaseworker.settings import Settings
from leaseworker.sinks.base import SinkError, Validity, always_valid
from leaseworker.worker.upstream import CLOSE_TIMEOUT_SECONDS
from leaseworker_dev.feed.server import FeedServer
from leaseworker_dev.local.invariants import read_events
from tests.worker.harness import eventually, running

RATE = 2000.0


class RefusingOnce:
    """Accepts every batch but the first: the first write of the run times out (a SinkError after
    half a second, as a Kinesis write past its deadline), while the socket is not read."""

    def __init__(self) -> None:
        self.refused_at: float | None = None
        self.accepted_at: list[float] = []

    async def write(self, records: Sequence[SinkRecord], *, valid: Validity = always_valid) -> None:
        if self.refused_at is None:
            await asyncio.sleep(0.5)
            self.refused_at = time.monotonic()
            raise SinkError("timed out once")
        self.accepted_at.append(time.monotonic())

    async def close(self) -> None:
        return None


async def test_a_reconnect_after_a_sink_error_does_not_wait_for_the_old_close(
    ddb: DynamoDBClient, table: str, settings: Settings, tmp_path: Path
) -> None:
    settings = replace(settings, reconcile_seconds=0.5)
    sink = RefusingOnce()
    log = tmp_path / "sessions.jsonl"
    async with FeedServer(rate=RATE, session_log=log) as feed:
        await LeaseTableAdmin(ddb, table).add("busy", feed.url_for("busy"))
        async with running(settings, sink=sink):
            await eventually(
                lambda: sink.refused_at is not None and sink.accepted_at, 15, "a refusal, then a write"
            )
            assert sink.refused_at is not None
            resumed = sink.accepted_at[0] - sink.refused_at
            # The old close alone would take CLOSE_TIMEOUT_SECONDS; the reconnect's own pacing
            # after a sink error is well under a second.
            assert resumed < CLOSE_TIMEOUT_SECONDS * 0.75, resumed
    # Both sockets were closed by the time the worker exited: the refused one in the background,
    # the last one at shutdown.
    closes = [event for event in read_events(log) if event["event"] == "close"]
    assert len(closes) >= 2, closes
