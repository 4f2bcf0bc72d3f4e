"""A graceful shutdown raises no alarm (connection mode, worker/keeper.py, worker/heartbeat.py).

Renewals are pipelined and keep going while a session hands its lease back, so one is often on
the wire when the release lands; DynamoDB then refuses it, rightly. That refusal says nothing
new: the release itself reports how the hand-back went. It used to log "renewal refused;
dropping the connection" at WARNING for each such lease: a 400-connection worker's graceful
shutdown wrote 399 of them, an operator's false alarm on every deploy. Likewise the last
heartbeat, on the wire when the ordered shutdown fences our own session as a clean exit, logged
"our session is fenced: stopping at once" at ERROR (4 of 5 runs of this test).

A proxy adds latency to the worker's DynamoDB traffic, so that renewals are in flight when the
releases land (a round trip of about 0.8 s, one heartbeat of 1 s); the worker then stops
gracefully. Judged from outside: every connection is released (no owner in the table), and
nothing was logged at WARNING or above.
"""

from __future__ import annotations

import asyncio
import io
import json
from dataclasses import replace

from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.observability.logging import configure_logging
from leaseworker.settings import Settings
from leaseworker_dev.feed.server import FeedServer
from leaseworker_dev.local.proxy import TcpProxy
from tests.worker.harness import eventually, running

IDS = sorted(f"c{i}" for i in range(12))
CHUNK_LATENCY = 0.4  # each way: about 0.8 s a round trip, within the 2.5 s validity


async def test_a_renewal_refused_after_our_own_release_is_not_a_lost_lease(
    ddb: DynamoDBClient, table: str, settings: Settings, dynamodb_proxy: TcpProxy
) -> None:
    admin = LeaseTableAdmin(ddb, table)
    worker = replace(settings, sink="null", lease_mode="connection", endpoint_url=dynamodb_proxy.url)
    logs = io.StringIO()
    async with FeedServer(rate=5) as feed:
        for cid in IDS:
            await admin.add(cid, feed.url_for(cid))
        configure_logging("INFO", logs)
        try:
            async with running(worker) as run:
                await eventually(lambda: run.worker.owned == IDS, 15, "the worker owning all twelve")
                dynamodb_proxy.latency = CHUNK_LATENCY
                # Three heartbeats at the slow round trip: renewals now overlap each lease's release.
                await asyncio.sleep(3 * settings.heartbeat_seconds)
            # Leaving `running` stopped the worker gracefully, the latency still on.
        finally:
            configure_logging("INFO")
    lines = [json.loads(line) for line in logs.getvalue().splitlines() if line.startswith("{")]
    messages = [line.get("message") for line in lines]
    released = [line["connection_id"] for line in lines if line.get("message") == "lease released"]
    refused = [line for line in lines if line.get("message") == "renewal refused; dropping the connection"]
    items = await admin.list()
    assert sorted(released) == IDS, messages[-30:]
    assert all(not item.get("lease_owner") for item in items), items
    assert refused == [], refused[:3]
    # Nor is our own clean-exit fence, met by a last heartbeat, reported as a fence.
    alarms = [line for line in lines if line.get("level") in ("WARNING", "ERROR")]
    assert alarms == [], alarms[:3]
