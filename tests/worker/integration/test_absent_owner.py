"""A connection held by a session that no longer exists is freed (review 2026-12-05, D).

A claim can land after its session was reaped (a worker paused with the request in flight past
fence, takeover and reap, or a reap on an index that did not list the claim yet). Before, nothing
freed such a connection: no takeover (no session to see fenced), no listing (session-held items
never expire) and no `remove --force` (its transaction needed the session item to carry a fence).
Now a fleet sweep writes a fenced stub for the absent owner, and the usual takeover follows, but
only LEASE_SECONDS after the stub on the taker's own clock; `remove` accepts an absent session.
The table is DynamoDB Local; the worker is the real one, in-process.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.attribute_values import session_key
from leaseworker.lease.liveness import ABSENT
from leaseworker.lease.session_store import SessionStore
from leaseworker.lease.vocabulary import SESSION_HELD
from leaseworker.settings import Settings
from leaseworker.worker.absent_owners import SWEEP_EVERY_LEASES
from tests.worker.harness import eventually, running

GHOST = "reaped-worker"
LIVE_PEER = "zz-live-peer"  # sorts after the worker under test, which therefore runs the sweep
URL = "ws://127.0.0.1:9/feeds/x"  # nothing listens: ownership is what is judged here


async def _held_by_ghost(
    ddb: DynamoDBClient, table: str, connection_id: str, state: str, *, owner: str = GHOST
) -> None:
    """As a claim that landed after its session was reaped leaves the item."""
    admin = LeaseTableAdmin(ddb, table)
    await admin.add(connection_id, URL)
    await ddb.update_item(
        TableName=table,
        Key={"connection_id": {"S": connection_id}},
        UpdateExpression="SET lease_owner = :ghost, lease_expires_at_ms = :held, desired_state = :state "
        "ADD lease_epoch :one",
        ExpressionAttributeValues={
            ":ghost": {"S": owner},
            ":held": {"N": str(SESSION_HELD)},
            ":state": {"S": state},
            ":one": {"N": "1"},
        },
    )


async def _item(ddb: DynamoDBClient, table: str, connection_id: str) -> dict[str, object]:
    response = await ddb.get_item(
        TableName=table, Key={"connection_id": {"S": connection_id}}, ConsistentRead=True
    )
    return dict(response.get("Item", {}))


async def test_a_connection_held_by_an_absent_session_is_taken_over(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    settings = replace(settings, sink="null", lease_mode="session")
    await _held_by_ghost(ddb, table, "c-ghost", "STARTED")
    sessions = SessionStore(ddb, table)
    async with running(settings):

        async def taken_over() -> bool:
            owner = (await _item(ddb, table, "c-ghost")).get("lease_owner")
            return owner == {"S": settings.worker_id}

        bound = (SWEEP_EVERY_LEASES + 2) * settings.lease_seconds + 3 * settings.heartbeat_seconds
        await eventually(taken_over, bound, "the absent owner's connection taken over")
        item = await _item(ddb, table, "c-ghost")
        stub = await sessions.get(GHOST)
        assert stub is not None and stub.fence_kind == ABSENT and stub.fenced_by == settings.worker_id
        assert stub.fenced_at_ms is not None
        # The takeover waited LEASE_SECONDS after the stub, on this host's clock (both stamps
        # are this process's wall clock: no other host is involved).
        claimed_at = int(item["updated_at_ms"]["N"])  # type: ignore[index]
        assert claimed_at - stub.fenced_at_ms >= settings.lease_seconds * 1000 - 50, (
            f"claimed {claimed_at - stub.fenced_at_ms} ms after the stub, inside the lease"
        )
        assert int(item["lease_epoch"]["N"]) == 2  # type: ignore[index]


async def test_a_live_owner_is_never_stubbed(ddb: DynamoDBClient, table: str, settings: Settings) -> None:
    """The sweep writes a stub only where no session item exists: a live peer that the listing
    has not shown yet (its session is read consistently) keeps what it holds."""
    settings = replace(settings, sink="null", lease_mode="session")
    sessions = SessionStore(ddb, table)
    await sessions.heartbeat(LIVE_PEER, load=1, capacity=10, lease_mode="session")
    await _held_by_ghost(ddb, table, "c-live", "STARTED", owner=LIVE_PEER)

    async def beat() -> None:
        assert isinstance(await sessions.heartbeat(LIVE_PEER, load=1, capacity=10, lease_mode="session"), int)

    async with running(settings) as run:
        # Past a sweep and the stub's wait, heartbeating like a live peer the whole time.
        for _ in range(int((SWEEP_EVERY_LEASES + 2) * settings.lease_seconds / settings.heartbeat_seconds)):
            await beat()
            await asyncio.sleep(settings.heartbeat_seconds)
        session = await sessions.get(LIVE_PEER)
        assert session is not None and not session.fenced
        assert (await _item(ddb, table, "c-live")).get("lease_owner") == {"S": LIVE_PEER}
        assert run.metrics.totals().get("LeasesRepaired", 0) == 0


async def test_remove_frees_a_stopped_connection_whose_session_is_absent(
    ddb: DynamoDBClient, table: str
) -> None:
    await _held_by_ghost(ddb, table, "c-stopped", "STOPPED")
    assert (await ddb.get_item(TableName=table, Key=session_key(GHOST))).get("Item") is None
    await LeaseTableAdmin(ddb, table).remove("c-stopped")
    assert "removed_at_ms" in await _item(ddb, table, "c-stopped")
