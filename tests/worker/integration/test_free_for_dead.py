"""Freeing a fenced peer's STOPPED connection keeps the dead holder's newer checkpoint (review
2026-12-05, C1): in session mode the item's `last_seq` is only the claim-time value, and the
holder's batched entry is the only fresh checkpoint. Once the owner is removed, the entry no
longer counts, so the release itself must carry it."""

from __future__ import annotations

import time
from dataclasses import replace

from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.checkpoint_store import CheckpointStore
from leaseworker.lease.held_store import SessionHeldStore
from leaseworker.lease.liveness import CONFIRMED
from leaseworker.lease.results import Acquired
from leaseworker.lease.session_store import SessionStore
from leaseworker.settings import Settings
from tests.worker.harness import eventually, running

DEAD = "dead-worker"


async def test_a_fenced_peers_stopped_connection_is_freed_with_its_newer_checkpoint(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    settings = replace(settings, sink="null", lease_mode="session")
    admin = LeaseTableAdmin(ddb, table)
    await admin.add("c0", "ws://127.0.0.1:9/c0")
    sessions = SessionStore(ddb, table)
    await sessions.heartbeat(DEAD, load=1, capacity=10, lease_mode="session")
    claim = await SessionHeldStore(ddb, settings).claim_free("c0", DEAD, valid_until=time.monotonic() + 60)
    assert isinstance(claim, Acquired) and claim.lease.epoch == 1
    assert await CheckpointStore(ddb, table).write(DEAD, {"c0": (1, 500)})
    await admin.stop("c0")  # the dead holder never saw the stop
    [item] = await admin.list()
    assert item["checkpoint"] == 500 and item["last_seq"] == -1, item
    assert await sessions.fence(DEAD, seen_hb=None, me="supervisor", kind=CONFIRMED, reason="exited")

    async with running(settings):

        async def freed() -> bool:
            [item] = await admin.list()
            return "lease_owner" not in item

        await eventually(freed, 5, "the dead peer's stopped connection freed")
    [item] = await admin.list()
    assert item["last_seq"] == 500 and item["checkpoint"] == 500, f"checkpoint moved back: {item}"
