"""`connections remove` and a later `add`: the epoch never goes backwards, and an operator cannot
cause two deliverers (DESIGN.md §2, §6). The table is DynamoDB Local.

The live-owner tests run real workers (in-process, the same wiring as `leaseworker run`) and the
real CLI (a subprocess), against the reference feed and against an upstream that never fences.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease.admin import (
    ConnectionExists,
    LeaseTableAdmin,
    NotRemovable,
    ReleaseTimeout,
    UnknownConnection,
)
from leaseworker.lease.removal import SESSION_HELD_EXPIRY_MS
from leaseworker.lease.store import Acquired, LeaseStore, Lost, now_ms
from leaseworker.settings import Settings

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
    store = LeaseStore(ddb, settings)
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
    store = LeaseStore(ddb, settings)
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
    acquired(await LeaseStore(ddb, settings).acquire("held", "w1"))
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
    store = LeaseStore(ddb, settings)
    await admin.add("c1", URL)
    lease = acquired(await store.acquire("c1", "w1")).lease
    await admin.stop("c1")
    with pytest.raises(NotRemovable) as refused:
        await admin.remove("c1")
    message = str(refused.value)
    assert "\n" not in message
    assert "is STOPPED but still held by w1 (epoch 1, lease " in message
    assert "wait for its release, or pass --force" in message
    assert (await admin.show("c1"))["lease_owner"] == "w1"
    assert await store.release(lease, None)  # the owner lets go: now it can go
    await admin.remove("c1")
    with pytest.raises(UnknownConnection):
        await admin.show("c1")


async def test_an_expired_lease_counts_as_released(ddb: DynamoDBClient, table: str) -> None:
    """A dead owner's STOPPED lease: removable once expired by the acquirer's rule, not before."""
    admin = LeaseTableAdmin(ddb, table, max_clock_skew_ms=1000)
    await admin.add("c1", URL)
    await admin.stop("c1")
    await set_attributes(
        ddb, table, "c1", lease_owner="dead", lease_epoch=3, lease_expires_at_ms=now_ms() - 500
    )
    with pytest.raises(NotRemovable, match="still held by dead"):
        await admin.remove("c1")  # expired 0.5 s ago: within the skew allowance, maybe still live
    await set_attributes(ddb, table, "c1", lease_expires_at_ms=now_ms() - 1500)
    await admin.remove("c1")
    await admin.add("c1", URL)
    assert (await admin.show("c1"))["lease_epoch"] == 3


async def test_a_session_held_lease_needs_the_sessions_fence(ddb: DynamoDBClient, table: str) -> None:
    admin = LeaseTableAdmin(ddb, table)
    await admin.add("c1", URL)
    await admin.stop("c1")
    await set_attributes(
        ddb, table, "c1", lease_owner="w9", lease_epoch=2, lease_expires_at_ms=SESSION_HELD_EXPIRY_MS
    )
    await ddb.put_item(
        TableName=table,
        Item={"connection_id": {"S": "worker#w9"}, "desired_state": {"S": "WORKER"}, "hb": {"N": "7"}},
    )
    with pytest.raises(NotRemovable, match="held by the live session of w9 \\(epoch 2\\)"):
        await admin.remove("c1")
    await set_attributes(ddb, table, "worker#w9", fenced_by="supervisor:w9", fence_kind="confirmed")
    await admin.remove("c1")
    assert "removed_at_ms" in await raw(ddb, table, "c1")


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
    await set_attributes(
        ddb, table, "c1", lease_owner="w9", lease_epoch=2, lease_expires_at_ms=SESSION_HELD_EXPIRY_MS
    )
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
