"""The connection-mode store's contract, against DynamoDB Local and the in-memory client (conftest.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import aioboto3
import pytest
from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.aws import LEASE_CLIENT_CONFIG
from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.connection_store import ConnectionStore
from leaseworker.lease.errors import StoreUnavailable, TableMissing
from leaseworker.lease.model import LeaseState
from leaseworker.lease.results import Acquired, Lost, Malformed, Renewed, Stopped
from leaseworker.settings import Settings
from leaseworker_dev.local.services import free_port

URL = "ws://127.0.0.1:9/feeds/x"


async def add(ddb: DynamoDBClient, table: str, *ids: str) -> None:
    admin = LeaseTableAdmin(ddb, table)
    for cid in ids:
        await admin.add(cid, URL)


def acquired(result: object) -> Acquired:
    assert isinstance(result, Acquired), result
    return result


async def test_fifty_concurrent_acquirers_one_winner(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    await add(ddb, table, "c1")
    store = ConnectionStore(ddb, settings)
    results = await asyncio.gather(*(store.acquire("c1", f"w{i}") for i in range(50)))
    winners = [r for r in results if isinstance(r, Acquired)]
    assert len(winners) == 1
    assert winners[0].lease.epoch == 1
    losers = [r for r in results if isinstance(r, Lost)]
    assert len(losers) == 49
    # ALL_OLD on the failed condition names the holder without a second read.
    assert {r.holder for r in losers} <= {winners[0].lease.owner, None}
    item = await store.get("c1")
    assert item is not None and item.lease_owner == winners[0].lease.owner and item.lease_epoch == 1


async def test_renewal_by_non_owner_fails(ddb: DynamoDBClient, table: str, settings: Settings) -> None:
    await add(ddb, table, "c1")
    store = ConnectionStore(ddb, settings)
    lease = acquired(await store.acquire("c1", "owner")).lease
    impostor = dataclasses.replace(lease, owner="impostor")
    result = await store.renew(impostor, timeout=1.0)
    assert isinstance(result, Lost) and result.holder == "owner"
    stale = dataclasses.replace(lease, epoch=lease.epoch - 1)
    assert isinstance(await store.renew(stale, timeout=1.0), Lost)
    assert isinstance(await store.renew(lease, timeout=1.0), Renewed)


async def test_epoch_increases_on_every_acquisition(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    await add(ddb, table, "c1")
    store = ConnectionStore(ddb, settings)
    epochs = []
    for i in range(4):
        lease = acquired(await store.acquire("c1", f"w{i}")).lease
        epochs.append(lease.epoch)
        assert await store.release(lease, None)
    assert epochs == [1, 2, 3, 4]
    item = await store.get("c1")
    assert item is not None and item.lease_epoch == 4 and item.lease_owner is None


async def test_live_lease_cannot_be_acquired(ddb: DynamoDBClient, table: str, settings: Settings) -> None:
    await add(ddb, table, "c1")
    store = ConnectionStore(ddb, settings)
    acquired(await store.acquire("c1", "a"))
    lost = await store.acquire("c1", "b")
    assert isinstance(lost, Lost) and lost.holder == "a" and lost.epoch == 1


async def test_expired_lease_is_taken_over_after_skew(ddb: DynamoDBClient, table: str) -> None:
    fast = Settings(
        table_name=table, lease_seconds=0.4, heartbeat_seconds=0.1, max_clock_skew_ms=50, worker_id="w"
    )
    await add(ddb, table, "c1")
    store = ConnectionStore(ddb, fast)
    first = acquired(await store.acquire("c1", "a")).lease
    await asyncio.sleep(0.55)
    second = acquired(await store.acquire("c1", "b"))
    assert second.lease.epoch == first.epoch + 1
    assert second.previous is not None and second.previous.lease_owner == "a"


async def test_release_is_conditional(ddb: DynamoDBClient, table: str, settings: Settings) -> None:
    await add(ddb, table, "c1")
    store = ConnectionStore(ddb, settings)
    lease = acquired(await store.acquire("c1", "a")).lease
    assert not await store.release(dataclasses.replace(lease, owner="b"), 10)
    assert not await store.release(dataclasses.replace(lease, epoch=99), 10)
    item = await store.get("c1")
    assert item is not None and item.lease_owner == "a" and item.last_seq == -1
    assert await store.release(lease, 10)
    item = await store.get("c1")
    assert (
        item is not None
        and item.lease_owner is None
        and item.lease_expires_at_ms == 0
        and item.last_seq == 10
    )
    # Released means immediately acquirable by anyone.
    assert acquired(await store.acquire("c1", "b")).lease.start_seq == 10


async def test_zombie_cannot_checkpoint_after_takeover(ddb: DynamoDBClient, table: str) -> None:
    fast = Settings(
        table_name=table, lease_seconds=0.4, heartbeat_seconds=0.1, max_clock_skew_ms=50, worker_id="w"
    )
    await add(ddb, table, "c1")
    store = ConnectionStore(ddb, fast)
    zombie = acquired(await store.acquire("c1", "zombie")).lease
    assert await store.checkpoint(zombie, 5)
    await asyncio.sleep(0.55)
    heir = acquired(await store.acquire("c1", "heir")).lease
    assert heir.start_seq == 5
    assert not await store.checkpoint(zombie, 50)
    assert not await store.release(zombie, 60)
    assert await store.checkpoint(heir, 7)
    item = await store.get("c1")
    assert item is not None and item.last_seq == 7 and item.lease_owner == "heir"


async def test_orphan_query_finds_new_and_released_never_live(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    await add(ddb, table, "new", "released", "live", "stopped")
    store = ConnectionStore(ddb, settings)
    released = acquired(await store.acquire("released", "a")).lease
    assert await store.release(released, None)
    acquired(await store.acquire("live", "a"))
    await LeaseTableAdmin(ddb, table).stop("stopped")
    assert sorted(await store.find_orphans(100)) == ["new", "released"]
    assert len(await store.find_orphans(1)) == 1


async def test_stopped_connection_renewal_says_stopped(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    await add(ddb, table, "c1")
    store = ConnectionStore(ddb, settings)
    lease = acquired(await store.acquire("c1", "a")).lease
    await LeaseTableAdmin(ddb, table).stop("c1")
    assert isinstance(await store.renew(lease, timeout=1.0), Stopped)
    assert await store.release(lease, None)


async def test_removed_connection_renewal_is_lost(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    await add(ddb, table, "c1")
    store = ConnectionStore(ddb, settings)
    lease = acquired(await store.acquire("c1", "a")).lease
    # Deleted behind the worker's back (`connections remove` refuses a held lease and keeps a tombstone).
    await ddb.delete_item(TableName=table, Key={"connection_id": {"S": "c1"}})
    result = await store.renew(lease, timeout=1.0)
    assert isinstance(result, Lost) and "no such connection" in result.reason


async def test_malformed_item_is_marked_failed_not_bounced(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    await ddb.put_item(
        TableName=table,
        Item={
            "connection_id": {"S": "broken"},
            "desired_state": {"S": "STARTED"},
            "lease_expires_at_ms": {"N": "0"},
            "last_seq": {"S": "not-a-number"},
        },
    )
    store = ConnectionStore(ddb, settings)
    assert await store.find_orphans(10) == ["broken"]
    result = await store.acquire("broken", "a")
    assert isinstance(result, Malformed)
    shown = await LeaseTableAdmin(ddb, table).show("broken")
    assert shown["desired_state"] == "STOPPED"
    assert "ws_url" in shown["last_error"] or "last_seq" in shown["last_error"]
    assert await store.find_orphans(10) == []


async def test_lost_lease_state_is_terminal(ddb: DynamoDBClient, table: str, settings: Settings) -> None:
    await add(ddb, table, "c1")
    lease = acquired(await ConnectionStore(ddb, settings).acquire("c1", "a")).lease
    now = time.monotonic()
    assert lease.is_valid(now)
    lease.lose("test")
    assert lease.state is LeaseState.LOST and not lease.is_valid(now)
    lease.renewed(now, settings)
    assert not lease.is_valid(now)


async def test_unreachable_store_raises_typed_error_within_deadline(settings: Settings) -> None:
    session = aioboto3.Session()
    async with session.client(
        "dynamodb",
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        region_name="us-east-1",
        config=LEASE_CLIENT_CONFIG,
    ) as client:
        store = ConnectionStore(client, settings, call_timeout=1.0)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.find_orphans(10)
        assert time.monotonic() - started < 3.0


async def test_missing_table_is_a_typed_error(ddb: DynamoDBClient, settings: Settings) -> None:
    with pytest.raises(TableMissing):
        await LeaseTableAdmin(ddb, "no-such-table").describe()


async def test_checkpoint_never_moves_backwards(ddb: DynamoDBClient, table: str, settings: Settings) -> None:
    await add(ddb, table, "c1")
    store = ConnectionStore(ddb, settings)
    lease = acquired(await store.acquire("c1", "w")).lease
    assert await store.checkpoint(lease, 10)
    # A reordered or retried write below the stored value: still ours, so success, and no regression.
    assert await store.checkpoint(lease, 4)
    assert await store.checkpoint(lease, 10)
    item = await store.get("c1")
    assert item is not None and item.last_seq == 10


async def test_acquire_whose_reply_is_lost_is_adopted(
    ddb: DynamoDBClient,
    table: str,
    settings: Settings,
    dynamodb_endpoint: str,
    network_client: DynamoDBClient,
) -> None:
    """The write lands but the reply arrives after the call's deadline: a read-back adopts it."""
    from urllib.parse import urlsplit

    from leaseworker.lease.errors import AcquireUncertain
    from leaseworker_dev.local.proxy import TcpProxy

    await add(ddb, table, "c1")
    target = urlsplit(dynamodb_endpoint)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 80)
    await proxy.start()
    try:
        session = aioboto3.Session()
        async with session.client(
            "dynamodb", endpoint_url=proxy.url, region_name="us-east-1", config=LEASE_CLIENT_CONFIG
        ) as slow_client:
            store = ConnectionStore(slow_client, settings, call_timeout=0.6)
            proxy.latency = 0.4  # request delivered after 0.4 s, reply back after 0.8 s
            with pytest.raises(AcquireUncertain) as caught:
                await store.acquire("c1", "w")
            proxy.latency = 0.0
            await asyncio.sleep(0.5)  # the delayed reply is discarded by the client
            adopted = await ConnectionStore(ddb, settings).resolve_uncertain(caught.value, "w")
    finally:
        await proxy.stop()
    assert adopted is not None, "the applied acquire must be adopted, not left orphaned"
    item = await ConnectionStore(ddb, settings).get("c1")
    assert item is not None and item.lease_owner == "w" and item.lease_epoch == adopted.lease.epoch == 1
    assert adopted.lease.valid_until <= caught.value.sent_at + settings.local_validity_seconds


async def test_uncertain_acquire_that_did_not_land_is_not_adopted(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    from leaseworker.lease.errors import AcquireUncertain

    await add(ddb, table, "c1")
    store = ConnectionStore(ddb, settings)
    other = acquired(await store.acquire("c1", "other")).lease
    uncertain = AcquireUncertain("lost", connection_id="c1", sent_at=time.monotonic(), expires_at_ms=1)
    assert await store.resolve_uncertain(uncertain, "w") is None
    item = await store.get("c1")
    assert item is not None and item.lease_owner == "other" and item.lease_epoch == other.epoch
