"""The checkpoint cursor rides beside `last_seq` in every write that carries a checkpoint
(docs/design.md §5), in both lease modes, against DynamoDB Local: a new owner resumes from the
cursor of the seq it resumes after, never from another seq's cursor, and a re-added id starts
with none."""

from __future__ import annotations

import json

from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.checkpoint_store import CheckpointStore
from leaseworker.lease.connection_store import ConnectionStore
from leaseworker.lease.held_store import SessionHeldStore
from leaseworker.lease.results import Acquired
from leaseworker.settings import Settings
from tests.worker.contract.test_session_stores import VALID, session_table  # noqa: F401 (fixture)

CONFIG = json.dumps({"connect": {"url": "ws://127.0.0.1:9/jet{{#cursor}}?cursor={{cursor}}{{/cursor}}"}})


async def add_generic(admin: LeaseTableAdmin, cid: str) -> None:
    await admin.add(
        cid, "ws://127.0.0.1:9/jet", protocol="generic/1", protocol_config=CONFIG, preset="jetstream"
    )


def cursor_of(item: dict[str, object]) -> object:
    return item.get("cursor")


async def test_connection_mode_checkpoint_release_and_next_acquire_carry_the_cursor(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    admin = LeaseTableAdmin(ddb, table)
    store = ConnectionStore(ddb, settings)
    await add_generic(admin, "c1")
    first = await store.acquire("c1", "w1")
    assert isinstance(first, Acquired)
    lease = first.lease
    assert (lease.protocol, lease.start_seq, lease.start_cursor) == ("generic/1", -1, None)
    assert lease.protocol_config == CONFIG
    assert await store.checkpoint(lease, 4, "1700000000000004")
    assert cursor_of(await admin.show("c1")) == "1700000000000004"
    # A retried (older) checkpoint is refused by `last_seq < :seq`: its cursor never lands either.
    assert await store.checkpoint(lease, 3, "1700000000000003")
    shown = await admin.show("c1")
    assert (shown["last_seq"], shown["cursor"]) == (4, "1700000000000004")
    assert await store.release(lease, 9, "1700000000000009")
    shown = await admin.show("c1")
    assert (shown["last_seq"], shown["cursor"], shown["checkpoint_cursor"]) == (
        9,
        "1700000000000009",
        "1700000000000009",
    )
    second = await store.acquire("c1", "w2")
    assert isinstance(second, Acquired)
    assert (second.lease.start_seq, second.lease.start_cursor) == (9, "1700000000000009")


async def test_a_release_without_progress_keeps_the_cursor(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    admin = LeaseTableAdmin(ddb, table)
    store = ConnectionStore(ddb, settings)
    await add_generic(admin, "c2")
    acquired = await store.acquire("c2", "w1")
    assert isinstance(acquired, Acquired)
    assert await store.checkpoint(acquired.lease, 2, '"b"')
    lease = acquired.lease
    lease.start_seq = 2  # what a new owner would hold after resuming from the checkpoint
    assert await store.release(lease, 2, None)  # nothing delivered since: last_seq and cursor stay
    shown = await admin.show("c2")
    assert (shown["last_seq"], shown["cursor"]) == (2, '"b"')


async def test_session_mode_entries_carry_the_cursor_and_a_claim_from_the_dead_resumes_from_it(
    ddb: DynamoDBClient,
    session_table: str,  # noqa: F811 (the fixture)
    settings: Settings,
) -> None:
    admin = LeaseTableAdmin(ddb, session_table)
    held = SessionHeldStore(ddb, settings)
    checkpoints = CheckpointStore(ddb, session_table)
    await add_generic(admin, "s1")
    claimed = await held.claim_free("s1", "dead", valid_until=VALID)
    assert isinstance(claimed, Acquired)
    lease = claimed.lease
    assert await checkpoints.write("dead", {"s1": (lease.epoch, 7)}, cursors={"s1": '{"BTC-USD":107}'})
    entries, cursors = await checkpoints.read_with_cursors("dead")
    assert entries == {"s1": (lease.epoch, 7)} and cursors == {"s1": '{"BTC-USD":107}'}
    shown = await admin.show("s1")  # the effective checkpoint is the entry's, with its cursor
    assert (shown["checkpoint"], shown["checkpoint_cursor"], shown.get("cursor")) == (
        7,
        '{"BTC-USD":107}',
        None,
    )
    (listed,) = [c for c in await admin.list() if c["connection_id"] == "s1"]
    assert (listed["checkpoint"], listed["checkpoint_cursor"]) == (7, '{"BTC-USD":107}')
    taken = await held.claim_from_dead(
        "s1",
        "heir",
        dead="dead",
        epoch=lease.epoch,
        resume_seq=7,
        resume_cursor='{"BTC-USD":107}',
        valid_until=VALID,
    )
    assert isinstance(taken, Acquired)
    assert (taken.lease.start_seq, taken.lease.start_cursor) == (7, '{"BTC-USD":107}')
    shown = await admin.show("s1")
    assert (shown["last_seq"], shown["cursor"]) == (7, '{"BTC-USD":107}')


async def test_a_claim_from_the_dead_behind_the_item_keeps_the_items_cursor(
    ddb: DynamoDBClient,
    session_table: str,  # noqa: F811 (the fixture)
    settings: Settings,
) -> None:
    admin = LeaseTableAdmin(ddb, session_table)
    held = SessionHeldStore(ddb, settings)
    await add_generic(admin, "s2")
    claimed = await held.claim_free("s2", "dead", valid_until=VALID)
    assert isinstance(claimed, Acquired)
    assert await held.release(claimed.lease, 12, '"twelve"')
    again = await held.claim_free("s2", "dead", valid_until=VALID)
    assert isinstance(again, Acquired)
    assert (again.lease.start_seq, again.lease.start_cursor) == (12, '"twelve"')
    # The dead holder's entry is older than the item: the item's seq and its cursor win.
    taken = await held.claim_from_dead(
        "s2",
        "heir",
        dead="dead",
        epoch=again.lease.epoch,
        resume_seq=5,
        resume_cursor='"five"',
        valid_until=VALID,
    )
    assert isinstance(taken, Acquired)
    assert (taken.lease.start_seq, taken.lease.start_cursor) == (12, '"twelve"')
    shown = await admin.show("s2")
    assert (shown["last_seq"], shown["cursor"]) == (12, '"twelve"')


async def test_a_re_added_connection_starts_without_a_cursor(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    admin = LeaseTableAdmin(ddb, table)
    store = ConnectionStore(ddb, settings)
    await add_generic(admin, "c3")
    acquired = await store.acquire("c3", "w1")
    assert isinstance(acquired, Acquired)
    assert await store.release(acquired.lease, 3, '"three"')
    await admin.stop("c3")
    await admin.remove("c3")
    await admin.add("c3", "ws://127.0.0.1:9/other")
    shown = await admin.show("c3")
    assert (shown["protocol"], shown["last_seq"]) == ("seqfeed/1", -1)
    assert "cursor" not in shown and "protocol_config" not in shown and "preset" not in shown
