"""`connections remove` and a later `add`: the epoch never goes backwards, and an operator cannot
cause two deliverers (docs/design.md §2, §6). The table is DynamoDB Local.

The live-owner tests run real workers (in-process, the same wiring as `leaseworker run`) and the
real CLI (a subprocess), against the reference feed and against an upstream that never fences.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import aioboto3
import pytest
from types_aiobotocore_dynamodb import DynamoDBClient
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from leaseworker.lease.admin import LeaseTableAdmin, NotRemovable, ReleaseTimeout
from leaseworker.lease.admin_errors import ConnectionExists, UnknownConnection
from leaseworker.lease.checkpoint_store import CheckpointStore
from leaseworker.lease.connection_store import ConnectionStore
from leaseworker.lease.dynamodb import now_ms
from leaseworker.lease.results import Acquired, Lost
from leaseworker.lease.session_store import SessionStore
from leaseworker.lease.vocabulary import SESSION_HELD
from leaseworker.settings import Settings
from leaseworker_dev.feed.server import FeedServer
from leaseworker_dev.local.invariants import Delivered, Report, check_s1, read_events
from tests.worker.harness import eventually, running

URL = "ws://127.0.0.1:9/feeds/x"


def acquired(result: object) -> Acquired:
    assert isinstance(result, Acquired), result
    return result


async def raw(ddb: DynamoDBClient, table: str, cid: str) -> dict[str, Any]:
    response = await ddb.get_item(TableName=table, Key={"connection_id": {"S": cid}}, ConsistentRead=True)
    return dict(response.get("Item", {}))


async def set_attributes(ddb: DynamoDBClient, table: str, cid: str, **values: str | int) -> None:
    """Overwrite attributes directly: a lease state the test needs, without a worker."""
    names = list(values)
    await ddb.update_item(
        TableName=table,
        Key={"connection_id": {"S": cid}},
        UpdateExpression="SET " + ", ".join(f"#{i} = :{i}" for i in range(len(names))),
        ExpressionAttributeNames={f"#{i}": name for i, name in enumerate(names)},
        ExpressionAttributeValues={
            f":{i}": {"N": str(value)} if isinstance(value, int) else {"S": value}
            for i, value in enumerate(values.values())
        },
    )


# ---------------------------------------------------------------------------- the epoch rule


async def test_remove_then_add_keeps_the_epoch_rising(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    admin = LeaseTableAdmin(ddb, table)
    store = ConnectionStore(ddb, settings)
    await admin.add("c1", URL)
    epochs: list[int] = []
    for _incarnation in range(3):
        for worker in ("a", "b"):
            lease = acquired(await store.acquire("c1", worker)).lease
            epochs.append(lease.epoch)
            assert await store.release(lease, None)
        await admin.stop("c1")
        await admin.remove("c1")
        await admin.add("c1", URL)
    assert epochs == [1, 2, 3, 4, 5, 6]
    item = await admin.show("c1")
    assert item["lease_epoch"] == 6 and item["desired_state"] == "STARTED" and item["last_seq"] == -1
    assert acquired(await store.acquire("c1", "a")).lease.epoch == 7


async def test_tombstone_is_invisible_to_workers_and_operators(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    admin = LeaseTableAdmin(ddb, table)
    store = ConnectionStore(ddb, settings)
    await admin.add("gone", URL)
    await admin.add("kept", URL)
    assert await store.release(acquired(await store.acquire("gone", "a")).lease, None)
    await admin.stop("gone")
    await admin.remove("gone")

    tombstone = await raw(ddb, table, "gone")
    assert tombstone["lease_epoch"] == {"N": "1"} and "removed_at_ms" in tombstone
    for absent in ("lease_owner", "lease_expires_at_ms"):  # out of both GSIs
        assert absent not in tombstone, absent
    assert tombstone["desired_state"] == {"S": "STOPPED"}

    assert await store.find_orphans(100) == ["kept"]
    assert await store.count_free() == 1  # the tombstone is not a free connection
    lost = await store.acquire("gone", "a")
    assert isinstance(lost, Lost)
    for index in ("by-state-expiry", "by-owner"):
        scanned = await ddb.scan(TableName=table, IndexName=index)
        assert all(item["connection_id"]["S"] != "gone" for item in scanned["Items"]), index
    assert [item["connection_id"] for item in await admin.list()] == ["kept"]
    for action in (admin.show, admin.stop, admin.start, admin.remove):
        with pytest.raises(UnknownConnection):
            await action("gone")
    assert "removed_at_ms" in await raw(ddb, table, "gone")  # `start` did not resurrect it

    await admin.add("gone", URL)
    with pytest.raises(ConnectionExists):
        await admin.add("gone", URL)
    assert sorted(await store.find_orphans(100)) == ["gone", "kept"]
    assert acquired(await store.acquire("gone", "b")).lease.epoch == 2


async def test_concurrent_adds_of_a_tombstone_one_wins(ddb: DynamoDBClient, table: str) -> None:
    admin = LeaseTableAdmin(ddb, table)
    await admin.add("c1", URL)
    await set_attributes(ddb, table, "c1", lease_epoch=41)
    await admin.stop("c1")
    await admin.remove("c1")
    results = await asyncio.gather(*(admin.add("c1", URL) for _ in range(10)), return_exceptions=True)
    assert sum(result is None for result in results) == 1
    assert all(isinstance(result, ConnectionExists) for result in results if result is not None)
    assert (await admin.show("c1"))["lease_epoch"] == 41


# ---------------------------------------------------------------------------- who may remove


async def test_remove_refused_while_started(ddb: DynamoDBClient, table: str, settings: Settings) -> None:
    admin = LeaseTableAdmin(ddb, table)
    await admin.add("free", URL)
    await admin.add("held", URL)
    acquired(await ConnectionStore(ddb, settings).acquire("held", "w1"))
    with pytest.raises(NotRemovable) as free:
        await admin.remove("free")
    with pytest.raises(NotRemovable) as held:
        await admin.remove("held")
    assert str(free.value) == (
        "connection 'free' is STARTED: stop it first (`leaseworker connections stop free`), "
        "or pass --force to stop it, wait for the release and remove it"
    )
    assert "is STARTED and held by w1 (epoch 1)" in str(held.value)
    assert {item["connection_id"] for item in await admin.list()} == {"free", "held"}


async def test_remove_refused_while_stopped_but_still_owned(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    admin = LeaseTableAdmin(ddb, table)
    store = ConnectionStore(ddb, settings)
    await admin.add("c1", URL)
    lease = acquired(await store.acquire("c1", "w1")).lease
    await admin.stop("c1")
    with pytest.raises(NotRemovable) as refused:
        await admin.remove("c1")
    message = str(refused.value)
    assert "\n" not in message
    assert "is STOPPED but still held by w1 (epoch 1; not renewed for " in message
    assert "wait for its release, or pass --force" in message
    assert (await admin.show("c1"))["lease_owner"] == "w1"
    assert await store.release(lease, None)  # the owner lets go: now it can go
    await admin.remove("c1")
    with pytest.raises(UnknownConnection):
        await admin.show("c1")


async def test_an_expired_lease_counts_as_released(ddb: DynamoDBClient, table: str) -> None:
    """A dead owner's STOPPED lease: removable once `--force` saw it unrenewed for LEASE_SECONDS
    on its own clock, and its epoch kept across remove and add."""
    admin = LeaseTableAdmin(ddb, table, lease_seconds=1.0)
    await admin.add("c1", URL)
    await admin.stop("c1")
    await set_attributes(
        ddb, table, "c1", lease_owner="dead", lease_epoch=3, lease_expires_at_ms=now_ms() - 60_000
    )

    async def no_hint() -> None:
        return None

    started = time.monotonic()
    await admin.remove_forced("c1", hint=no_hint, wait_seconds=5)
    assert time.monotonic() - started >= 1.0  # watched for a lease period first
    await admin.add("c1", URL)
    assert (await admin.show("c1"))["lease_epoch"] == 3


async def test_expiry_is_not_judged_on_the_operators_wall_clock(ddb: DynamoDBClient, table: str) -> None:
    """Review 2026-12-05, J: an operator whose clock runs ahead of the workers' sees a live
    lease as expired. Removal must not believe it: only a lease seen unrenewed for LEASE_SECONDS
    on the operator's own monotonic clock is expired, and a renewal in between restarts the
    watch."""
    admin = LeaseTableAdmin(ddb, table, max_clock_skew_ms=1000, lease_seconds=1.5)
    await admin.add("c1", URL)
    await admin.stop("c1")
    # As an operator 30 s ahead sees it: expired by its clock, renewed a moment ago by the holder's.
    await set_attributes(
        ddb, table, "c1", lease_owner="w1", lease_epoch=2, lease_expires_at_ms=now_ms() - 30_000
    )
    with pytest.raises(NotRemovable, match="still held by w1"):
        await admin.remove("c1")

    async def renew_meanwhile() -> None:  # the holder renews once more (before it saw the stop)
        await asyncio.sleep(0.8)
        await set_attributes(ddb, table, "c1", lease_expires_at_ms=now_ms() - 29_000)

    async def no_hint() -> None:
        return None

    renewal = asyncio.create_task(renew_meanwhile())
    started = time.monotonic()
    await admin.remove_forced("c1", hint=no_hint, wait_seconds=10)
    await renewal
    assert time.monotonic() - started >= 0.8 + 1.5, "removed before a lease period passed unrenewed"


async def test_a_session_held_lease_needs_the_sessions_fence(ddb: DynamoDBClient, table: str) -> None:
    admin = LeaseTableAdmin(ddb, table)
    await admin.add("c1", URL)
    await admin.stop("c1")
    await set_attributes(ddb, table, "c1", lease_owner="w9", lease_epoch=2, lease_expires_at_ms=SESSION_HELD)
    await ddb.put_item(
        TableName=table,
        Item={"connection_id": {"S": "worker#w9"}, "desired_state": {"S": "WORKER"}, "hb": {"N": "7"}},
    )
    with pytest.raises(NotRemovable, match="held by the live session of w9 \\(epoch 2\\)"):
        await admin.remove("c1")
    await set_attributes(ddb, table, "worker#w9", fenced_by="supervisor:w9", fence_kind="confirmed")
    await admin.remove("c1")
    assert "removed_at_ms" in await raw(ddb, table, "c1")


async def test_removing_a_fenced_sessions_connection_keeps_its_batched_checkpoint(
    ddb: DynamoDBClient, table: str
) -> None:
    """The holder's checkpoint entry (§2b) was newer than the item's `last_seq`; once the owner
    is gone nobody reads that entry for this connection, so the tombstone carries it (found by
    the simulation: the recorded checkpoint moved back from 36 to 15, seed 119 mixed)."""
    admin = LeaseTableAdmin(ddb, table)
    await admin.add("c1", URL)
    await admin.stop("c1")
    await set_attributes(
        ddb, table, "c1", lease_owner="w9", lease_epoch=2, lease_expires_at_ms=SESSION_HELD, last_seq=15
    )
    await CheckpointStore(ddb, table).write("w9", {"c1": (2, 36)}, cursors={"c1": '{"time_us": 36}'})
    await ddb.put_item(
        TableName=table,
        Item={
            "connection_id": {"S": "worker#w9"},
            "desired_state": {"S": "WORKER"},
            "hb": {"N": "7"},
            "fenced_by": {"S": "w1"},
        },
    )
    assert (await admin.show("c1"))["checkpoint"] == 36
    await admin.remove("c1")
    item = await raw(ddb, table, "c1")
    assert "removed_at_ms" in item and "lease_owner" not in item
    assert item["last_seq"] == {"N": "36"}
    assert item["cursor"] == {"S": '{"time_us": 36}'}


# ---------------------------------------------------------------------------- --force, no worker


async def test_force_stops_a_free_connection_and_removes_it(ddb: DynamoDBClient, table: str) -> None:
    admin = LeaseTableAdmin(ddb, table)
    await admin.add("c1", URL)
    hints: list[str] = []

    async def hint() -> None:
        hints.append("c1")

    await admin.remove_forced("c1", hint=hint, wait_seconds=5)
    assert hints == ["c1"]
    assert (await raw(ddb, table, "c1"))["desired_state"] == {"S": "STOPPED"}
    with pytest.raises(UnknownConnection):
        await admin.show("c1")


async def test_force_gives_up_after_its_wait_and_leaves_it_stopped(ddb: DynamoDBClient, table: str) -> None:
    admin = LeaseTableAdmin(ddb, table)
    await admin.add("c1", URL)
    await set_attributes(ddb, table, "c1", lease_owner="w9", lease_epoch=2, lease_expires_at_ms=SESSION_HELD)
    # w9's session is live (not fenced): an absent one would make c1 removable at once.
    await SessionStore(ddb, table).heartbeat("w9", load=1, capacity=10, lease_mode="session")
    lines: list[str] = []

    async def hint() -> None:
        pass

    started = time.monotonic()
    with pytest.raises(ReleaseTimeout) as timeout:
        await admin.remove_forced("c1", hint=hint, wait_seconds=1.0, progress=lines.append)
    assert 1.0 <= time.monotonic() - started < 1.0 + 10.0  # bounded: its wait plus a few polls
    assert str(timeout.value).startswith(
        "connection 'c1' is STOPPED but still held by the live session of w9"
    )
    assert "after waiting 1 s; it stays STOPPED" in str(timeout.value)
    assert lines and lines[0].startswith("waiting for the release: c1 is STOPPED but still held")
    item = await admin.show("c1")
    assert item["desired_state"] == "STOPPED" and item["lease_owner"] == "w9"


async def test_force_yields_to_an_operator_who_starts_it_again(ddb: DynamoDBClient, table: str) -> None:
    admin = LeaseTableAdmin(ddb, table)
    await admin.add("c1", URL)
    await set_attributes(ddb, table, "c1", lease_owner="w1", lease_expires_at_ms=now_ms() + 60_000)

    async def hint() -> None:
        await admin.start("c1")  # the other operator wins the race

    with pytest.raises(NotRemovable, match="is STARTED and held by w1"):
        await admin.remove_forced("c1", hint=hint, wait_seconds=5)
    assert (await admin.show("c1"))["desired_state"] == "STARTED"


async def test_table_create_makes_both_indexes_and_ttl(ddb: DynamoDBClient, table: str) -> None:
    described = (await ddb.describe_table(TableName=table))["Table"]
    indexes = {index["IndexName"]: index for index in described.get("GlobalSecondaryIndexes", [])}
    assert set(indexes) == {"by-state-expiry", "by-owner"}
    assert indexes["by-owner"]["KeySchema"] == [{"AttributeName": "lease_owner", "KeyType": "HASH"}]
    assert indexes["by-owner"]["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    ttl = (await ddb.describe_time_to_live(TableName=table))["TimeToLiveDescription"]
    assert ttl.get("AttributeName") == "purge_at" and ttl.get("TimeToLiveStatus") in ("ENABLED", "ENABLING")
    assert not await LeaseTableAdmin(ddb, table).create_table()  # already exists


# ---------------------------------------------------------------------------- a live owner, real workers

LEASEWORKER = Path(sys.executable).with_name("leaseworker")
OLD_EPOCH = 5  # earlier incarnations reached this epoch; a reset would restart at 1


class NonFencingFeed:
    """`seqfeed/1` without fencing: it serves every subscriber, whatever its epoch, and never
    answers `stale_epoch`. Only the workers' own discipline can then keep S1."""

    def __init__(self, rate: float = 100.0) -> None:
        self._rate = rate
        self._server: Server | None = None
        self.subscribes: list[tuple[int, str]] = []  # (epoch, worker_id)

    async def __aenter__(self) -> NonFencingFeed:
        self._server = await serve(self._handle, "127.0.0.1", 0, compression=None, close_timeout=1)
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def url_for(self, cid: str) -> str:
        assert self._server is not None
        return f"ws://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/feeds/{cid}"

    async def _handle(self, connection: ServerConnection) -> None:
        try:
            subscribe = json.loads(await connection.recv())
            self.subscribes.append((int(subscribe["epoch"]), str(subscribe["worker_id"])))
            seq = int(subscribe["after_seq"]) + 1
            while True:
                await connection.send(json.dumps({"type": "data", "seq": seq, "data": {"n": seq}}))
                seq += 1
                await asyncio.sleep(1 / self._rate)
        except ConnectionClosed:
            pass


async def leaseworker(
    *args: str, endpoint: str, table: str, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """The real CLI, as a subprocess, while the in-process workers keep running."""
    process = await asyncio.create_subprocess_exec(
        str(LEASEWORKER),
        "--endpoint-url",
        endpoint,
        "--table",
        table,
        *args,
        env={
            **{k: v for k, v in os.environ.items() if k != "NOTIFY_QUEUE_URL"},
            "AWS_REGION": "us-east-1",
            **(env or {}),
        },
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def sink_lines(directory: Path) -> dict[str, list[Delivered]]:
    """Each worker's file, in its write order (one file = one arbiter of its own order)."""
    lines: dict[str, list[Delivered]] = {}
    for path in sorted(directory.glob("*.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        lines[path.name] = [
            Delivered(
                r["connection_id"], int(r["seq"]), int(r["epoch"]), r["worker_id"], int(r["received_at_ms"])
            )
            for r in records
            if r["connection_id"] == "c1"
        ]
    return lines


async def sink_when_removed(ddb: DynamoDBClient, table: str, sink_dir: Path) -> dict[str, int]:
    """Lines per sink file at the first sight of the tombstone (polled every 20 ms)."""
    deadline = time.monotonic() + 60
    while "removed_at_ms" not in await raw(ddb, table, "c1"):
        assert time.monotonic() < deadline, "no tombstone within 60 s"
        await asyncio.sleep(0.02)
    return {name: len(records) for name, records in sink_lines(sink_dir).items()}


async def remove_and_add_with_live_owner(
    ddb: DynamoDBClient,
    table: str,
    settings: Settings,
    sink_dir: Path,
    url: str,
    *,
    cli_env: dict[str, str] | None = None,
) -> tuple[list[Delivered], list[Delivered]]:
    """Two workers; `c1` delivering; `remove` refused, `remove --force`, `add`; the sink's records
    of the old incarnation (all that had landed when remove returned) and of the new one."""
    admin = LeaseTableAdmin(ddb, table)
    endpoint = str(settings.endpoint_url)
    await admin.add("c1", url)
    await set_attributes(ddb, table, "c1", lease_epoch=OLD_EPOCH)
    sink = f"file:{sink_dir}"
    # A heartbeat long enough that an owner which was not waited for would visibly keep going.
    settings = replace(settings, lease_seconds=6.0, heartbeat_seconds=2.0)
    first = replace(settings, worker_id="wa", sink=sink)
    second = replace(settings, worker_id="wb", sink=sink)
    async with running(first) as a:
        await eventually(lambda: "c1" in a.worker.owned, 10, "c1 owned by wa")
        async with running(second):
            await eventually(lambda: len(sink_lines(sink_dir).get("wa.jsonl", [])) >= 20, 10, "c1 delivering")

            code, _, err = await leaseworker(
                "connections", "remove", "c1", endpoint=endpoint, table=table, env=cli_env
            )
            assert code == 2, err
            assert err.strip() == (
                f"error: connection 'c1' is STARTED and held by wa (epoch {OLD_EPOCH + 1}): stop it first "
                "(`leaseworker connections stop c1`), or pass --force to stop it, wait for the release "
                "and remove it"
            )
            # The arbiter: what had landed in the sink the moment the tombstone was written.
            async with asyncio.TaskGroup() as group:
                removing = group.create_task(
                    leaseworker(
                        "connections", "remove", "c1", "--force", endpoint=endpoint, table=table, env=cli_env
                    )
                )
                watching = group.create_task(sink_when_removed(ddb, table, sink_dir))
            code, out, err = removing.result()
            landed = watching.result()
            assert code == 0 and out.strip() == "removed c1", (code, out, err)

            code, out, err = await leaseworker(
                "connections", "add", "c1", "--url", url, endpoint=endpoint, table=table, env=cli_env
            )
            assert code == 0, err

            def new_records() -> list[Delivered]:
                return [
                    record
                    for name, records in sink_lines(sink_dir).items()
                    for record in records[landed.get(name, 0) :]
                ]

            await eventually(lambda: len(new_records()) >= 30, 15, "the new incarnation delivering")
    old = [
        record for name, records in sink_lines(sink_dir).items() for record in records[: landed.get(name, 0)]
    ]
    return old, new_records()


def assert_one_deliverer_and_rising_epochs(old: list[Delivered], new: list[Delivered]) -> None:
    assert old and new
    assert {record.epoch for record in old} == {OLD_EPOCH + 1}
    # Nothing of the old incarnation landed after `remove` returned, and every new epoch is higher.
    assert min(record.epoch for record in new) > max(record.epoch for record in old), sorted(
        {record.epoch for record in new}
    )
    report = Report()
    check_s1({"c1": old + new}, report)  # one clock (one process) stamps every record
    assert report.ok, report.violations
    assert max(r.received_at_ms for r in old) <= min(r.received_at_ms for r in new)


async def test_force_remove_and_add_with_a_live_owner_reference_feed(
    ddb: DynamoDBClient, table: str, settings: Settings, tmp_path: Path
) -> None:
    log = tmp_path / "feed.jsonl"
    async with FeedServer(rate=100, session_log=log) as feed:
        old, new = await remove_and_add_with_live_owner(
            ddb, table, settings, tmp_path / "sink", feed.url_for("c1")
        )
        assert feed.highest_epoch("c1") == max(record.epoch for record in new)
    assert_one_deliverer_and_rising_epochs(old, new)
    rejected = [event for event in read_events(log) if event["event"] == "reject"]
    assert rejected == [], rejected  # a reset epoch would be answered stale_epoch here
    closes = [
        event for event in read_events(log) if event["event"] == "close" and event["epoch"] == OLD_EPOCH + 1
    ]
    assert closes and closes[0]["code"] == 1001  # the old owner closed gracefully before the release


@pytest.mark.parametrize("hints", [True, False], ids=["sqs-hints", "no-hints"])
async def test_force_remove_and_add_with_a_live_owner_non_fencing_upstream(
    ddb: DynamoDBClient,
    table: str,
    settings: Settings,
    tmp_path: Path,
    moto_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    hints: bool,
) -> None:
    """An upstream that would happily serve two deliverers. With SQS hints the CLI's stop reaches
    a worker at once; without them, the owner notices it at its next renewal."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", moto_endpoint)
    cli_env: dict[str, str] = {}
    if hints:
        session = aioboto3.Session()
        async with session.client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1") as sqs:
            queue_url = (await sqs.create_queue(QueueName=f"hints-{table}"))["QueueUrl"]
        settings = replace(settings, notify_queue_url=queue_url)
        cli_env = {"NOTIFY_QUEUE_URL": queue_url, "AWS_ENDPOINT_URL_SQS": moto_endpoint}
    async with NonFencingFeed() as feed:
        old, new = await remove_and_add_with_live_owner(
            ddb, table, settings, tmp_path / "sink", feed.url_for("c1"), cli_env=cli_env
        )
    assert_one_deliverer_and_rising_epochs(old, new)
    epochs = [epoch for epoch, _ in feed.subscribes]
    # Subscriptions in arrival order: the old epoch, then only higher ones (a reset would go to 1).
    assert epochs[0] == OLD_EPOCH + 1 and epochs[-1] > OLD_EPOCH + 1 and epochs == sorted(epochs), epochs
