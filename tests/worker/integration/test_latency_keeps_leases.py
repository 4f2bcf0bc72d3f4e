"""DynamoDB latency must not move leases (issue 20, item 3b), in both lease modes.

A proxy adds 700 ms to each chunk in both directions (a round trip of about 1.4 s, against a
3 s lease with 1 s heartbeats) to one worker's DynamoDB traffic for 10 s. A renewal or heartbeat
that succeeds late is still a renewal: every write lands within the lease it extends, so the
worker must keep all its leases. Judged from outside: no connection's `lease_epoch` changes, and
the feed server sees no connection go unsubscribed for longer than about a second.

In session mode the session heartbeat renews every lease: past LEASE_SECONDS − margin − H
(1.7 s here) each lease waits for the heartbeat in flight sent before its deadline, so the
session stays while R ≤ 2H (2 s). Before that wait (2026-12-07), 1.7 s was a cliff 0.3 s above
the fault, and one stall of CI's loaded machine lapsed the session and moved all eight leases.
tests/worker/unit/test_heartbeat_latency.py crosses that line on purpose, in virtual time.

A third case makes the round trip about 1.7 s in connection mode: past V − H (1.5 s), where the
lease used to be lost at its local deadline, and within 2H (2 s), where a renewal in flight
still answers in time (`Lease.awaiting_renewal`): deliveries pause, the socket and lease stay.

A second worker (direct to DynamoDB) observes the slow one's `hb` on its own clock, so the
observer's judgement (fence a peer whose counter stood still for LEASE_SECONDS) is real. It holds
one connection of its own at MAX_CONNECTIONS = 1, so fair share leaves the slow worker all eight.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path

import aioboto3
import pytest
from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.connection_store import ConnectionStore
from leaseworker.lease.results import Acquired, Renewed, Stopped
from leaseworker.observability.metrics import MetricName
from leaseworker.settings import LeaseMode, Settings
from leaseworker_dev.feed.server import FeedServer
from leaseworker_dev.local.proxy import TcpProxy
from tests.worker.harness import eventually, running

CHUNK_LATENCY = 0.7  # seconds added to each chunk, each way: about 1.4 s a round trip
BEYOND_V_MINUS_H = 0.85  # about 1.7 s a round trip: past V − H, within 2H (see worker/keeper.py)
FAULT_SECONDS = 10.0
MAX_GAP_MS = 1000  # "no subscriber" longer than this is a moved (or lapsed) lease
IDS = [f"c{i}" for i in range(8)]


async def round_trip(endpoint: str, table: str) -> float:
    """One GetItem's round trip through `endpoint` on a fresh client, in seconds."""
    async with aioboto3.Session().client(
        "dynamodb", endpoint_url=endpoint, region_name="us-east-1"
    ) as client:
        started = time.monotonic()
        await client.get_item(TableName=table, Key={"connection_id": {"S": "c0"}})
        return time.monotonic() - started


def longest_gaps(log: Path, start_ms: int, end_ms: int) -> dict[str, int]:
    """Per connection: the longest time within [start_ms, end_ms] with no subscribed session."""
    opened: dict[int, tuple[str, int]] = {}
    spans: dict[str, list[tuple[int, int]]] = {}
    for line in log.read_text().splitlines():
        event = json.loads(line)
        cid = event["connection_id"]
        if event["event"] == "subscribe":
            opened[event["session"]] = (cid, event["t_ms"])
        elif event["event"] == "close" and event["session"] in opened:
            cid, began = opened.pop(event["session"])
            spans.setdefault(cid, []).append((began, event["t_ms"]))
    for cid, began in opened.values():
        spans.setdefault(cid, []).append((began, end_ms))
    gaps: dict[str, int] = {}
    for cid, intervals in spans.items():
        covered_to, longest = start_ms, 0
        for began, ended in sorted(intervals):
            if ended <= covered_to:
                continue
            longest = max(longest, min(began, end_ms) - covered_to)
            covered_to = max(covered_to, began, ended) if began <= covered_to else ended
            if covered_to >= end_ms:
                break
        gaps[cid] = max(longest, end_ms - covered_to)
    return gaps


@pytest.mark.parametrize(
    ("mode", "chunk_latency"),
    [
        ("connection", CHUNK_LATENCY),
        ("session", CHUNK_LATENCY),
        # A round trip of about 1.7 s: past V − H (1.5 s), within 2H (2 s). Each renewal still
        # lands within the lease it extends, so nothing may move; deliveries pause meanwhile.
        ("connection", BEYOND_V_MINUS_H),
    ],
    ids=["connection", "session", "connection-1.7s"],
)
async def test_a_slow_but_timely_dynamodb_moves_no_lease(
    ddb: DynamoDBClient,
    table: str,
    settings: Settings,
    dynamodb_proxy: TcpProxy,
    tmp_path: Path,
    mode: LeaseMode,
    chunk_latency: float,
) -> None:
    admin = LeaseTableAdmin(ddb, table)
    base = replace(settings, sink="null", lease_mode=mode)
    slow = replace(base, worker_id="slow", endpoint_url=dynamodb_proxy.url)
    observer = replace(base, worker_id="observer", max_connections=1)
    log = tmp_path / "feed-sessions.jsonl"
    async with FeedServer(rate=20, session_log=log) as feed:
        await admin.add("obs", feed.url_for("obs"))
        async with running(observer) as watching:
            await eventually(lambda: watching.worker.owned == ["obs"], 10, "the observer owns its one")
            for cid in IDS:
                await admin.add(cid, feed.url_for(cid))
            async with running(slow) as run:
                await eventually(lambda: run.worker.owned == IDS, 15, "the slow worker owns all eight")
                await eventually(lambda: "slow" in watching.worker.peers, 10, "the observer sees it live")
                await asyncio.sleep(2 * settings.heartbeat_seconds)  # settled
                before = {item["connection_id"]: item["lease_epoch"] for item in await admin.list()}

                dynamodb_proxy.latency = chunk_latency
                fault_ms = time.time_ns() // 1_000_000
                rtt = await round_trip(dynamodb_proxy.url, table)
                print(
                    f"DynamoDB round trip through the proxy: {rtt:.2f} s (lease {settings.lease_seconds} s)"
                )
                assert rtt >= 1.85 * chunk_latency, f"the fault is milder than meant: {rtt:.2f} s"
                await asyncio.sleep(FAULT_SECONDS - rtt)
                dynamodb_proxy.latency = 0.0
                await asyncio.sleep(2 * settings.lease_seconds)  # anything lapsed shows by now
                end_ms = time.time_ns() // 1_000_000
                after = {item["connection_id"]: item["lease_epoch"] for item in await admin.list()}
                totals = run.metrics.totals()
                owned = run.worker.owned
    gaps = longest_gaps(log, fault_ms, end_ms)
    print(f"{mode}: epochs {before} -> {after}; longest unsubscribed ms {gaps}; metrics {totals}")
    moved = {cid: (before[cid], after[cid]) for cid in before if before[cid] != after[cid]}
    assert not moved, f"leases moved under latency (epoch before, after): {moved}"
    assert owned == IDS, owned
    assert totals.get(MetricName.SelfFenced, 0) == 0, totals
    assert totals.get(MetricName.LeasesLost, 0) == 0, totals
    long_gaps = {cid: ms for cid, ms in gaps.items() if ms > MAX_GAP_MS}
    assert not long_gaps, f"connections without a subscriber for too long (ms): {long_gaps}"


async def test_a_late_older_renewal_never_moves_the_expiry_back(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    """Renewals are pipelined, so they may land out of order: one that would write an earlier
    expiry than the item has is refused by its condition and counts as renewed (the item still
    expires no sooner than it would have made it); a stopped connection is still `Stopped`."""
    await LeaseTableAdmin(ddb, table).add("c1", "ws://127.0.0.1:9/feeds/c1")
    store = ConnectionStore(ddb, settings)
    acquired = await store.acquire("c1", "w1")
    assert isinstance(acquired, Acquired), acquired
    lease = acquired.lease
    newer = time.time_ns() // 1_000_000 + 60_000  # as if a renewal sent later had landed first
    key = {"connection_id": {"S": "c1"}}
    await ddb.update_item(
        TableName=table,
        Key=key,
        UpdateExpression="SET lease_expires_at_ms = :e",
        ExpressionAttributeValues={":e": {"N": str(newer)}},
    )
    assert isinstance(await store.renew(lease, timeout=2.0), Renewed)
    item = (await ddb.get_item(TableName=table, Key=key, ConsistentRead=True))["Item"]
    assert int(item["lease_expires_at_ms"]["N"]) == newer
    await ddb.update_item(
        TableName=table,
        Key=key,
        UpdateExpression="SET desired_state = :s",
        ExpressionAttributeValues={":s": {"S": "STOPPED"}},
    )
    assert isinstance(await store.renew(lease, timeout=2.0), Stopped)


async def test_a_silent_dynamodb_still_fences_within_one_validity_past_the_deadline(
    table: str, ddb: DynamoDBClient, settings: Settings, dynamodb_proxy: TcpProxy, tmp_path: Path
) -> None:
    """Waiting for a renewal in flight is bounded: only renewals sent before the deadline are
    awaited, each for at most its own validity V. So when DynamoDB goes silent (a blackhole: no
    reply ever), the lease is lost, and the upstream socket closed, within V of the deadline,
    that is within H + 2V of the silence."""
    admin = LeaseTableAdmin(ddb, table)
    config = replace(settings, sink="null", lease_mode="connection", endpoint_url=dynamodb_proxy.url)
    log = tmp_path / "feed-sessions.jsonl"
    ids = ["c0", "c1"]
    bound = config.heartbeat_seconds + 2 * config.local_validity_seconds
    async with FeedServer(rate=20, session_log=log) as feed:
        for cid in ids:
            await admin.add(cid, feed.url_for(cid))
        async with running(config) as run:
            await eventually(lambda: run.worker.owned == ids, 10, "both owned")
            await asyncio.sleep(2 * config.heartbeat_seconds)
            dynamodb_proxy.set_mode("blackhole")
            silent_ms = time.time_ns() // 1_000_000
            started = time.monotonic()
            await eventually(
                lambda: run.metrics.totals().get(MetricName.SelfFenced, 0) >= len(ids),
                bound + 3,
                "both leases lost",
            )
            took = time.monotonic() - started
            dynamodb_proxy.set_mode("pass")
    closes = [
        event
        for event in map(json.loads, log.read_text().splitlines())
        if event["event"] == "close" and event["t_ms"] >= silent_ms
    ]
    print(f"lost {took:.2f} s after DynamoDB went silent (bound {bound:.1f} s)")
    assert took <= bound + 0.5, f"the lease outlived its bound: {took:.2f} s > {bound:.1f} s"
    first_close = {event["connection_id"]: event["t_ms"] - silent_ms for event in reversed(closes)}
    assert set(first_close) >= set(ids), closes
    assert all(ms <= (bound + 0.5) * 1000 for ms in first_close.values()), first_close
