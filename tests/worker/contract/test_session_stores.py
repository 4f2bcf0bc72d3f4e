"""Session mode's store contract, against DynamoDB Local and the in-memory client (conftest.py;
docs/design.md §2.0, §2b).

Sessions: the fence and a zombie's heartbeat after it; checkpoints: batched, fenced, never
backwards; session-held connections: invisible to connection mode, claimed by owner + epoch;
and the cost of listing the sessions, measured with ReturnConsumedCapacity.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any, cast

import pytest
from types_aiobotocore_dynamodb import DynamoDBClient

import leaseworker.lease.connection_reads as reads_module
import leaseworker.lease.connection_store as store_module
import leaseworker.lease.held_store as held_store_module
from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.batch_get import batch_get_items
from leaseworker.lease.checkpoint_store import (
    CheckpointStore,
    CheckpointTooLarge,
    check_checkpoint_capacity,
    effective_checkpoint,
    resume_seq,
)
from leaseworker.lease.connection_store import ConnectionStore
from leaseworker.lease.dynamodb import now_ms
from leaseworker.lease.errors import StoreRejected, StoreUnavailable
from leaseworker.lease.held_store import SessionHeldStore
from leaseworker.lease.liveness import CONFIRMED, SUSPECTED, Observer, PeerState, live_worker_ids
from leaseworker.lease.model import Lease
from leaseworker.lease.rendezvous import rank
from leaseworker.lease.results import Acquired, Lost
from leaseworker.lease.session_store import VANISHED, Fenced, SessionStore
from leaseworker.lease.vocabulary import INDEX_BY_OWNER, MAX_CURSOR_BYTES, MAX_ENTRIES_PER_ITEM, SESSION_HELD
from leaseworker.settings import Settings, SettingsError

URL = "ws://127.0.0.1:9/feeds/x"
VALID = 1e12  # a session deadline far away: these tests are about the table, not the clock
TEN_YEARS_MS = 10 * 365 * 24 * 3600 * 1000


@pytest.fixture
async def session_table(ddb: DynamoDBClient, table: str) -> str:
    """The lease table plus the sparse `by-owner` index (added here if `table create` lacks it)."""
    described = await ddb.describe_table(TableName=table)
    indexes = {i["IndexName"] for i in described["Table"].get("GlobalSecondaryIndexes", [])}
    if INDEX_BY_OWNER not in indexes:
        await ddb.update_table(
            TableName=table,
            AttributeDefinitions=[{"AttributeName": "lease_owner", "AttributeType": "S"}],
            GlobalSecondaryIndexUpdates=[
                {
                    "Create": {
                        "IndexName": INDEX_BY_OWNER,
                        "KeySchema": [{"AttributeName": "lease_owner", "KeyType": "HASH"}],
                        "Projection": {"ProjectionType": "KEYS_ONLY"},
                    }
                }
            ],
        )
        for _ in range(100):
            described = await ddb.describe_table(TableName=table)
            statuses = {
                i["IndexName"]: i.get("IndexStatus") for i in described["Table"]["GlobalSecondaryIndexes"]
            }
            if statuses.get(INDEX_BY_OWNER) == "ACTIVE":
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("by-owner index never became ACTIVE")
    return table


@pytest.fixture
def sessions(ddb: DynamoDBClient, session_table: str) -> SessionStore:
    return SessionStore(ddb, session_table)


@pytest.fixture
def held(ddb: DynamoDBClient, session_table: str, settings: Settings) -> SessionHeldStore:
    return SessionHeldStore(ddb, settings)


@pytest.fixture
def checkpoints(ddb: DynamoDBClient, session_table: str) -> CheckpointStore:
    return CheckpointStore(ddb, session_table)


class CapacityMeter:
    """Asks DynamoDB for ConsumedCapacity on every call and adds it up per operation."""

    def __init__(self) -> None:
        self.units: dict[str, float] = defaultdict(float)
        self.index_units: dict[str, float] = defaultdict(float)

    def ask(self, params: dict[str, Any], **_: Any) -> None:
        params["ReturnConsumedCapacity"] = "INDEXES"

    def record(self, parsed: dict[str, Any], model: Any, **_: Any) -> None:
        consumed = parsed.get("ConsumedCapacity", [])
        for entry in consumed if isinstance(consumed, list) else [consumed]:
            self.units[model.name] += float(entry.get("CapacityUnits", 0))
            for name, part in entry.get("GlobalSecondaryIndexes", {}).items():
                self.index_units[name] += float(part.get("CapacityUnits", 0))

    def reset(self) -> None:
        self.units.clear()
        self.index_units.clear()


@pytest.fixture
def meter(network_client: DynamoDBClient) -> Iterator[CapacityMeter]:
    meter = CapacityMeter()
    events = network_client.meta.events
    events.register("provide-client-params.dynamodb.*", meter.ask)
    events.register("after-call.dynamodb.*", meter.record)
    yield meter
    events.unregister("provide-client-params.dynamodb.*", meter.ask)
    events.unregister("after-call.dynamodb.*", meter.record)


async def add(ddb: DynamoDBClient, table: str, *ids: str) -> None:
    admin = LeaseTableAdmin(ddb, table)
    for cid in ids:
        await admin.add(cid, URL)


async def item(ddb: DynamoDBClient, table: str, key: str) -> dict[str, Any]:
    response = await ddb.get_item(TableName=table, Key={"connection_id": {"S": key}}, ConsistentRead=True)
    return dict(response.get("Item", {}))


def acquired(result: object) -> Lease:
    assert isinstance(result, Acquired), result
    return result.lease


async def beat(sessions: SessionStore, me: str, load: int = 0) -> int | Fenced:
    return await sessions.heartbeat(me, load=load, capacity=100, lease_mode="session")


# ---------------------------------------------------------------------- session items


async def test_heartbeat_creates_then_counts_without_touching_the_index(
    ddb: DynamoDBClient, sessions: SessionStore, session_table: str, meter: CapacityMeter
) -> None:
    assert await beat(sessions, "w1") == 1
    assert meter.index_units["by-state-expiry"] > 0  # the first one puts the session in the index
    assert [await beat(sessions, "w1", load=i) for i in range(3)] == [2, 3, 4]
    stored = await item(ddb, session_table, "worker#w1")
    assert stored["desired_state"] == {"S": "WORKER"} and stored["lease_expires_at_ms"] == {"N": "0"}
    assert stored["load"] == {"N": "2"} and stored["capacity"] == {"N": "100"}
    assert abs(int(stored["purge_at"]["N"]) - (time.time() + 3 * 86400)) < 60
    meter.reset()
    assert await beat(sessions, "w1") == 5
    # One small write on the table, none on either index: heartbeats never move an index key.
    assert meter.units["UpdateItem"] == 1.0
    assert dict(meter.index_units) == {}
    (listed,) = await sessions.list_sessions()
    assert (listed.worker_id, listed.hb, listed.load, listed.lease_mode) == ("w1", 5, 0, "session")


async def test_observer_fence_needs_the_counter_it_saw_and_the_zombie_learns_it(
    ddb: DynamoDBClient, sessions: SessionStore, checkpoints: CheckpointStore, session_table: str
) -> None:
    assert await beat(sessions, "victim") == 1
    assert await checkpoints.write("victim", {"c1": (1, 10)})
    assert await beat(sessions, "victim") == 2
    # The observer saw hb = 1 and thinks it stopped: the peer moved on, so the fence fails.
    assert not await sessions.fence("victim", seen_hb=1, me="obs", kind=SUSPECTED, reason="hb still")
    assert await sessions.fence("victim", seen_hb=2, me="obs", kind=SUSPECTED, reason="hb still 20 s")
    zombie = await beat(sessions, "victim")
    assert zombie == Fenced("obs", SUSPECTED, "hb still 20 s")
    assert (await item(ddb, session_table, "worker#victim"))["hb"] == {"N": "2"}
    # Its checkpoint item is fenced too: late checkpoint writes are refused.
    assert not await checkpoints.write("victim", {"c1": (1, 11)})
    assert await checkpoints.read("victim") == {"c1": (1, 10)}
    # A second fence (a racing observer, or the supervisor) finds it fenced already.
    assert not await sessions.fence("victim", seen_hb=2, me="obs2", kind=SUSPECTED, reason="x")
    assert not await sessions.fence("victim", seen_hb=None, me="supervisor:t", kind=CONFIRMED, reason="x")
    (listed,) = await sessions.list_sessions()
    assert listed.fenced and listed.fenced_by == "obs" and listed.fence_kind == SUSPECTED


async def test_confirmed_fence_needs_no_counter_but_never_creates_a_session(
    ddb: DynamoDBClient, sessions: SessionStore, session_table: str
) -> None:
    assert not await sessions.fence("ghost", seen_hb=None, me="supervisor:t", kind=CONFIRMED, reason="exit")
    assert await item(ddb, session_table, "worker#ghost") == {}
    await beat(sessions, "child")
    await beat(sessions, "child")
    assert await sessions.fence("child", seen_hb=None, me="supervisor:t", kind=CONFIRMED, reason="exit -9")
    assert await beat(sessions, "child") == Fenced("supervisor:t", CONFIRMED, "exit -9")
    with pytest.raises(ValueError, match="confirmed"):
        await sessions.fence("child", seen_hb=None, me="obs", kind=SUSPECTED, reason="x")


async def test_a_reaped_session_is_never_recreated_by_its_zombie(
    ddb: DynamoDBClient, sessions: SessionStore, session_table: str
) -> None:
    await beat(sessions, "w1")
    assert not await sessions.reap("w1")  # only fenced sessions are reaped
    assert await sessions.fence("w1", seen_hb=1, me="obs", kind=SUSPECTED, reason="still")
    assert await sessions.reap("w1")
    assert await beat(sessions, "w1") == Fenced(None, VANISHED, "session item no longer exists")
    assert await item(ddb, session_table, "worker#w1") == {}
    assert await item(ddb, session_table, "worker#w1#ckpt") == {}


async def test_withdrawn_session_stays_listed_not_counted_and_its_connections_stay_held(
    ddb: DynamoDBClient, sessions: SessionStore, held: SessionHeldStore, session_table: str
) -> None:
    await add(ddb, session_table, "c1")
    await beat(sessions, "leaver")
    lease = acquired(await held.claim_free("c1", "leaver", valid_until=VALID))
    assert await sessions.withdraw("leaver")
    assert await beat(sessions, "leaver") == 2  # it keeps its session while it releases
    (listed,) = await sessions.list_sessions()
    assert listed.withdrawn and not listed.fenced
    verdicts = Observer("peer", 10.0).observe([listed], 0.0)
    assert verdicts[0].state is PeerState.WITHDRAWN
    # A withdrawal is not a fence: the connection is neither free nor claimable by owner + epoch.
    assert await ConnectionStore(ddb, held._settings).find_orphans(10) == []
    assert await held.release(lease, 7)
    stored = await item(ddb, session_table, "c1")
    assert "lease_owner" not in stored and stored["last_seq"] == {"N": "7"}
    await sessions.fence("leaver", seen_hb=2, me="obs", kind=SUSPECTED, reason="still")
    assert not await sessions.withdraw("leaver")


# ---------------------------------------------------------------------- session-held connections


async def test_session_held_connection_is_invisible_to_connection_mode_at_any_clock(
    ddb: DynamoDBClient,
    held: SessionHeldStore,
    session_table: str,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await add(ddb, session_table, "held", "free")
    lease = acquired(await held.claim_free("held", "s1", valid_until=VALID))
    assert lease.epoch == 1 and lease.owner == "s1" and lease.ws_url == URL and lease.valid_until == VALID
    stored = await item(ddb, session_table, "held")
    assert stored["lease_expires_at_ms"] == {"N": str(SESSION_HELD)} and stored["lease_owner"] == {"S": "s1"}
    connection_mode = ConnectionStore(ddb, settings)
    # A connection-mode worker whose wall clock runs ten years fast still sees it as held.
    real_now = now_ms
    monkeypatch.setattr(reads_module, "now_ms", lambda: real_now() + TEN_YEARS_MS)
    monkeypatch.setattr(store_module, "now_ms", lambda: real_now() + TEN_YEARS_MS)
    assert await connection_mode.find_orphans(100) == ["free"]
    lost = await connection_mode.acquire("held", "c1")
    assert isinstance(lost, Lost) and lost.holder == "s1" and lost.epoch == 1
    assert acquired(await connection_mode.acquire("free", "c1")).epoch == 1
    # And a session claimer does not take it as free either, whatever its clock says.
    monkeypatch.setattr(held_store_module, "now_ms", lambda: real_now() + TEN_YEARS_MS)
    assert isinstance(await held.claim_free("held", "s2", valid_until=VALID), Lost)


async def test_claim_free_takes_an_expired_connection_mode_lease(
    ddb: DynamoDBClient,
    held: SessionHeldStore,
    session_table: str,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await add(ddb, session_table, "c1")
    old = acquired(await ConnectionStore(ddb, settings).acquire("c1", "conn-worker"))
    assert isinstance(await held.claim_free("c1", "s1", valid_until=VALID), Lost)  # still live
    real_now = now_ms
    later = settings.lease_seconds * 1000 + settings.max_clock_skew_ms + 1
    monkeypatch.setattr(held_store_module, "now_ms", lambda: real_now() + int(later))
    lease = acquired(await held.claim_free("c1", "s1", valid_until=VALID))
    assert lease.epoch == old.epoch + 1


async def test_claim_from_dead_needs_owner_and_epoch_and_one_claimer_wins(
    ddb: DynamoDBClient, held: SessionHeldStore, session_table: str
) -> None:
    await add(ddb, session_table, "c1")
    dead = acquired(await held.claim_free("c1", "dead", valid_until=VALID))
    wrong = [
        await held.claim_from_dead(
            "c1", "me", dead="other", epoch=dead.epoch, resume_seq=-1, valid_until=VALID
        ),
        await held.claim_from_dead(
            "c1", "me", dead="dead", epoch=dead.epoch + 1, resume_seq=-1, valid_until=VALID
        ),
    ]
    assert all(isinstance(r, Lost) and r.holder == "dead" for r in wrong)
    results = await asyncio.gather(
        *(
            held.claim_from_dead(
                "c1", f"w{i}", dead="dead", epoch=dead.epoch, resume_seq=-1, valid_until=VALID
            )
            for i in range(10)
        )
    )
    winners = [r for r in results if isinstance(r, Acquired)]
    assert len(winners) == 1 and winners[0].lease.epoch == dead.epoch + 1
    assert all(isinstance(r, Lost) for r in results if r is not winners[0])
    stored = await item(ddb, session_table, "c1")
    assert stored["lease_owner"] == {"S": winners[0].lease.owner}
    assert stored["lease_expires_at_ms"] == {"N": str(SESSION_HELD)}
    # The dead holder's late release (a zombie) fails on the epoch.
    assert not await held.release(dead, 99)


async def test_suspected_fence_never_takes_a_connection_mode_lease_confirmed_does(
    ddb: DynamoDBClient, held: SessionHeldStore, session_table: str, settings: Settings
) -> None:
    await add(ddb, session_table, "c1")
    lease = acquired(await ConnectionStore(ddb, settings).acquire("c1", "dead"))
    kwargs: dict[str, Any] = {"dead": "dead", "epoch": lease.epoch, "resume_seq": -1, "valid_until": VALID}
    assert isinstance(await held.claim_from_dead("c1", "me", **kwargs), Lost)
    taken = acquired(await held.claim_from_dead("c1", "me", confirmed=True, **kwargs))
    assert taken.epoch == lease.epoch + 1


async def test_claim_consolidates_the_dead_holders_checkpoint_and_never_goes_backwards(
    ddb: DynamoDBClient, held: SessionHeldStore, checkpoints: CheckpointStore, session_table: str
) -> None:
    await add(ddb, session_table, "ahead", "behind", "stale-epoch")
    # "behind": a previous holder released it at 50; the dead holder's checkpoint says only 30.
    first = acquired(await held.claim_free("behind", "previous", valid_until=VALID))
    assert await held.release(first, 50)
    leases = {
        cid: acquired(await held.claim_free(cid, "dead", valid_until=VALID))
        for cid in ("ahead", "behind", "stale-epoch")
    }
    assert leases["behind"].start_seq == 50
    assert await checkpoints.write(
        "dead",
        {
            "ahead": (leases["ahead"].epoch, 42),
            "behind": (leases["behind"].epoch, 30),
            "stale-epoch": (0, 99),
        },
    )
    entries = await checkpoints.read("dead")
    results = {}
    for cid, lease in leases.items():
        resume = resume_seq(entries, cid, lease.epoch)
        results[cid] = acquired(
            await held.claim_from_dead(
                cid, "me", dead="dead", epoch=lease.epoch, resume_seq=resume, valid_until=VALID
            )
        )
    expected = {"ahead": 42, "behind": 50, "stale-epoch": -1}
    assert {cid: r.start_seq for cid, r in results.items()} == expected
    for cid, seq in expected.items():
        stored = await item(ddb, session_table, cid)
        assert stored["last_seq"] == {"N": str(seq)} and stored["lease_owner"] == {"S": "me"}
    # The release moves last_seq only up: a final seq below the item's is not written.
    assert await held.release(results["behind"], 40)
    assert (await item(ddb, session_table, "behind"))["last_seq"] == {"N": "50"}


async def test_owned_by_lists_a_workers_connections_with_epochs_through_the_index(
    ddb: DynamoDBClient, held: SessionHeldStore, session_table: str, settings: Settings
) -> None:
    ids = [f"c{i:03d}" for i in range(130)]  # more than one BatchGetItem
    for start in range(0, len(ids), 25):
        await ddb.batch_write_item(
            RequestItems={
                session_table: [
                    {
                        "PutRequest": {
                            "Item": {
                                "connection_id": {"S": cid},
                                "desired_state": {"S": "STARTED"},
                                "ws_url": {"S": URL},
                                "last_seq": {"N": "-1"},
                                "lease_expires_at_ms": {"N": "0"},
                                "lease_epoch": {"N": "3"},
                            }
                        }
                    }
                    for cid in ids[start : start + 25]
                ]
            }
        )
    for cid in ids[:-1]:
        acquired(await held.claim_free(cid, "dead", valid_until=VALID))
    acquired(await ConnectionStore(ddb, settings).acquire(ids[-1], "dead"))
    await held.claim_free("other", "someone", valid_until=VALID)  # absent: not listed anywhere
    owned = await held.owned_by("dead")
    assert [o.connection_id for o in owned] == ids
    assert {o.epoch for o in owned} == {4}
    assert [o.session_held for o in owned] == [True] * 129 + [False]
    assert await held.owned_by("nobody") == []


async def test_mark_failed_stops_a_session_held_connection(
    ddb: DynamoDBClient, held: SessionHeldStore, session_table: str, settings: Settings
) -> None:
    await add(ddb, session_table, "c1")
    lease = acquired(await held.claim_free("c1", "s1", valid_until=VALID))
    assert await held.mark_failed(lease, "bad scheme")
    stored = await item(ddb, session_table, "c1")
    assert stored["desired_state"] == {"S": "STOPPED"} and stored["lease_expires_at_ms"] == {"N": "0"}
    assert await held.owned_by("s1") == []


# ---------------------------------------------------------------------- checkpoint items


async def test_checkpoint_item_holds_max_entries_of_worst_case_size(
    ddb: DynamoDBClient, checkpoints: CheckpointStore, session_table: str
) -> None:
    worst = {f"{i:06d}".ljust(128, "x"): (2**53 - 2, 2**63 - 1) for i in range(MAX_ENTRIES_PER_ITEM)}
    cursors = {cid: '"' + "c" * (MAX_CURSOR_BYTES - 2) + '"' for cid in worst}  # the largest cursor
    assert await checkpoints.write("w" * 128, worst, cursors=cursors)
    assert await checkpoints.read_with_cursors("w" * 128) == (worst, cursors)
    with pytest.raises(CheckpointTooLarge):
        await checkpoints.write("w1", {**worst, "one-more": (1, 1)})
    # The bound is tight, not arbitrary: 7% more worst-case entries exceed DynamoDB's 400 KB.
    over = {
        f"{i:06d}".ljust(128, "x"): (2**53 - 2, 2**63 - 1) for i in range(MAX_ENTRIES_PER_ITEM * 107 // 100)
    }
    cursor = {"S": '"' + "c" * (MAX_CURSOR_BYTES - 2) + '"'}
    with pytest.raises(StoreRejected, match="size"):
        await checkpoints._call(
            ddb.put_item(
                TableName=session_table,
                Item={
                    "connection_id": {"S": "worker#" + "w" * 128 + "#ckpt"},
                    "checkpoints": {
                        "M": {k: {"L": [{"N": str(e)}, {"N": str(s)}, cursor]} for k, (e, s) in over.items()}
                    },
                },
            )
        )


def test_effective_checkpoint_is_the_newer_of_item_and_entry_at_the_items_epoch() -> None:
    entries = {"c1": (4, 90), "c2": (3, 90), "c3": (4, 10)}
    assert effective_checkpoint(50, 4, "c1", entries) == 90
    assert effective_checkpoint(50, 4, "c2", entries) == 50  # an older epoch's entry is ignored
    assert effective_checkpoint(50, 4, "c3", entries) == 50
    assert effective_checkpoint(50, 4, "absent", entries) == 50


def test_settings_validation_refuses_more_connections_than_one_item_holds() -> None:
    check_checkpoint_capacity(MAX_ENTRIES_PER_ITEM)
    with pytest.raises(SettingsError, match="MAX_CONNECTIONS"):
        check_checkpoint_capacity(MAX_ENTRIES_PER_ITEM + 1)


async def test_a_late_older_checkpoint_write_never_overwrites_a_newer_one(
    ddb: DynamoDBClient, session_table: str
) -> None:
    store = CheckpointStore(ddb, session_table)
    assert await store.write("w1", {"c1": (1, 5)})
    assert await store.write("w1", {"c1": (1, 9)})
    store._written = 1  # replay the first write's counter, as if it had been overtaken in flight
    assert await store.write("w1", {"c1": (1, 5)})  # superseded: not an error, not a fence
    assert await store.read("w1") == {"c1": (1, 9)}
    # A new incarnation (another store instance) starts its own counter and is not blocked.
    assert await CheckpointStore(ddb, session_table).write("w1", {"c1": (2, 1)})
    assert await store.read("w1") == {"c1": (2, 1)}


# ---------------------------------------------------------------------- cost


async def listing_cost(
    ddb: DynamoDBClient, table: str, meter: CapacityMeter, connections: int
) -> tuple[float, float]:
    sessions = SessionStore(ddb, table)
    for w in range(5):
        await beat(sessions, f"w{w}", load=connections // 5)
    existing = int((await ddb.scan(TableName=table, Select="COUNT"))["Count"]) - 5
    for start in range(existing, connections, 25):
        await ddb.batch_write_item(
            RequestItems={
                table: [
                    {
                        "PutRequest": {
                            "Item": {
                                "connection_id": {"S": f"conn-{i:05d}"},
                                "desired_state": {"S": "STARTED"},
                                "ws_url": {"S": URL},
                                "lease_owner": {"S": f"w{i % 5}"},
                                "lease_expires_at_ms": {"N": str(SESSION_HELD if i % 2 else 0)},
                                "lease_epoch": {"N": "1"},
                            }
                        }
                    }
                    for i in range(start, min(start + 25, connections))
                ]
            }
        )
    meter.reset()
    listed = await sessions.list_sessions()
    assert [s.worker_id for s in listed] == [f"w{w}" for w in range(5)]
    return meter.units["Query"], meter.units["BatchGetItem"]


async def test_listing_sessions_costs_the_same_at_10_and_500_connections(
    ddb: DynamoDBClient, session_table: str, meter: CapacityMeter, capsys: pytest.CaptureFixture[str]
) -> None:
    small = await listing_cost(ddb, session_table, meter, 10)
    large = await listing_cost(ddb, session_table, meter, 500)
    with capsys.disabled():
        print(f"\nlist_sessions read units, 5 sessions: 10 connections {small}, 500 connections {large}")
    assert small == large
    query_units, batch_units = large
    assert query_units <= 0.5  # one 4 KB page of keys, eventually consistent
    assert batch_units <= 5 * 0.5  # one eventually consistent read of each small session item


# ---------------------------------------------------------------------- composition


async def test_takeover_of_a_silent_session_end_to_end(
    ddb: DynamoDBClient,
    sessions: SessionStore,
    held: SessionHeldStore,
    checkpoints: CheckpointStore,
    session_table: str,
) -> None:
    """How the pieces compose: observe on our clock, fence, list by owner, read the dead holder's
    checkpoints once, and claim in rendezvous order (first choice now, the others later)."""
    ids = [f"feed-{i:02d}" for i in range(12)]
    await add(ddb, session_table, *ids)
    for worker in ("a", "b", "dead"):
        await beat(sessions, worker)
    dead_leases = {cid: acquired(await held.claim_free(cid, "dead", valid_until=VALID)) for cid in ids}
    assert await checkpoints.write("dead", {cid: (lease.epoch, 10) for cid, lease in dead_leases.items()})
    observers = {me: Observer(me, 10.0) for me in ("a", "b")}
    for now in (0.0, 5.0, 10.0):  # the survivors keep beating; "dead" is silent
        for me in ("a", "b"):
            await beat(sessions, me)
        listed = await sessions.list_sessions()
        verdicts = {me: obs.observe(listed, now) for me, obs in observers.items()}
    (dead_verdict,) = [v for v in verdicts["a"] if v.worker_id == "dead"]
    assert dead_verdict.state is PeerState.DEAD
    assert live_worker_ids(verdicts["a"]) == ["a", "b"]
    # Both observers fence with the counter they saw: exactly one fence lands.
    fences = await asyncio.gather(
        *(
            sessions.fence("dead", seen_hb=dead_verdict.hb, me=me, kind=SUSPECTED, reason="hb still 10 s")
            for me in ("a", "b")
        )
    )
    assert sorted(fences) == [False, True]
    owned = await held.owned_by("dead")
    entries = await checkpoints.read("dead")
    first_round = {}
    for connection in owned:
        me = rank(connection.connection_id, ["a", "b"])[0]
        first_round[connection.connection_id] = acquired(
            await held.claim_from_dead(
                connection.connection_id,
                me,
                dead="dead",
                epoch=connection.epoch,
                resume_seq=resume_seq(entries, connection.connection_id, connection.epoch),
                valid_until=VALID,
            )
        )
    owners = Counter(lease.owner for lease in first_round.values())
    assert set(owners) == {"a", "b"} and sum(owners.values()) == len(ids)
    assert {lease.start_seq for lease in first_round.values()} == {10}
    # The second choices, a step later, find nothing left: every claim by the old epoch fails.
    for connection in owned:
        late = await held.claim_from_dead(
            connection.connection_id,
            rank(connection.connection_id, ["a", "b"])[1],
            dead="dead",
            epoch=connection.epoch,
            resume_seq=10,
            valid_until=VALID,
        )
        assert isinstance(late, Lost) and late.holder == first_round[connection.connection_id].owner
    assert await held.owned_by("dead") == []
    assert await sessions.reap("dead")


class ScriptedClient:
    """A stand-in for the DynamoDB client that answers BatchGetItem from a script."""

    def __init__(self, answers: list[dict[str, Any]], delay: float = 0.0) -> None:
        self.answers = answers
        self.delay = delay
        self.requests: list[dict[str, Any]] = []

    async def batch_get_item(self, *, RequestItems: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(RequestItems)
        await asyncio.sleep(self.delay)
        return self.answers.pop(0)


async def test_batch_get_retries_unprocessed_keys() -> None:
    keys = [{"connection_id": {"S": f"k{i}"}} for i in range(3)]
    client = ScriptedClient(
        [
            {"Responses": {"t": [keys[0]]}, "UnprocessedKeys": {"t": {"Keys": keys[1:]}}},
            {"Responses": {"t": keys[1:]}},
        ]
    )
    items = await batch_get_items(cast(Any, client), "t", keys, timeout=1.0)
    assert items == keys
    assert client.requests[1] == {"t": {"Keys": keys[1:]}}


async def test_batch_get_gives_up_at_its_deadline() -> None:
    client = ScriptedClient([{"Responses": {"t": []}}], delay=30.0)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        await batch_get_items(cast(Any, client), "t", [{"connection_id": {"S": "k"}}], timeout=0.2)
    assert time.monotonic() - started < 5.0
