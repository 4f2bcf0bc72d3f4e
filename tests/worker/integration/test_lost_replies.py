"""Claims whose reply is lost (review 2026-12-05, A and I): the write reached DynamoDB Local and
was applied, the worker never heard back. The item then names us; it must be served (adopted) or
released, never left held by a live session that does not serve it (session mode: for the
worker's lifetime; connection mode: until it expires)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.connection_store import ConnectionStore
from leaseworker.lease.errors import AcquireUncertain
from leaseworker.lease.held_store import SessionHeldStore
from leaseworker.lease.liveness import SessionValidity
from leaseworker.settings import LeaseMode, Settings
from leaseworker_dev.feed.server import FeedServer
from tests.worker.harness import eventually, running
from tests.worker.lost_reply import LostReplies, Mode, is_claim


@pytest.mark.parametrize("mode", ["session", "connection"])
async def test_a_claim_whose_reply_is_lost_to_an_sdk_retry_is_adopted(
    ddb: DynamoDBClient, table: str, settings: Settings, mode: LeaseMode
) -> None:
    settings = replace(settings, sink="null", lease_mode=mode)
    admin = LeaseTableAdmin(ddb, table)
    lost: list[LostReplies] = []

    def wrap(client: DynamoDBClient) -> DynamoDBClient:
        injector = LostReplies(client, match=is_claim, mode="retry")
        injector.remaining = 1
        lost.append(injector)
        return injector.as_client()

    async with FeedServer() as feed:
        await admin.add("c0", feed.url_for("c0"))
        async with running(settings, wrap_dynamodb=wrap) as run:
            # Within a reconcile (and well inside a lease: connection mode's expiry would free
            # it after about 3 s, and a claim by expiry would show epoch 2).
            await eventually(lambda: run.worker.owned == ["c0"], 2.0, "the applied claim adopted")
            assert lost[0].dropped == 1
            [item] = await admin.list()
            assert item["lease_owner"] == settings.worker_id and item["lease_epoch"] == 1, item


@pytest.mark.parametrize("reply", ["timeout", "retry"])
async def test_a_session_claim_whose_reply_is_lost_is_uncertain_and_read_back(
    ddb: DynamoDBClient, table: str, settings: Settings, reply: Mode
) -> None:
    from leaseworker.lease.checkpoint_store import CheckpointStore
    from leaseworker.lease.session_leases import SessionLeases

    settings = replace(settings, lease_mode="session")
    await LeaseTableAdmin(ddb, table).add("c0", "ws://127.0.0.1:9/c0")
    injector = LostReplies(ddb, match=is_claim, mode=reply)
    injector.remaining = 1
    client = injector.as_client()
    validity = SessionValidity(settings)
    validity.heartbeat_succeeded(time.monotonic())
    leases = SessionLeases(
        ConnectionStore(ddb, settings),
        SessionHeldStore(client, settings, call_timeout=0.5),
        CheckpointStore(ddb, table),
        validity,
        settings,
    )
    with pytest.raises(AcquireUncertain) as caught:
        await leases.claim("c0")
    adopted = await leases.resolve_uncertain(caught.value)
    assert adopted is not None and adopted.lease.epoch == 1 and adopted.lease.owner == settings.worker_id
    assert adopted.lease.valid_until == validity.valid_until  # the session's deadline, no later
