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


@pytest.mark.parametrize("stopped", [False, True])
async def test_a_connection_claim_read_back_after_its_deadline_is_renewed_before_it_is_served(
    ddb: DynamoDBClient, table: str, settings: Settings, stopped: bool
) -> None:
    """The fault suite's ddb_lost_reply (2026-12-07): a claim's reply was lost and its read-back,
    slow like the replies, found it ours but past the claim's local deadline. Adopted as it was,
    the session self-fenced at once and the connection waited for its expiry and a reconcile
    (6.1 s unserved against L1's 5.9 s). It is renewed first and served under the renewal; an
    operator's stop that came meanwhile makes the renewal say so, and the lease is released."""
    from leaseworker.lease.ownership import ConnectionLeases

    settings = replace(settings, lease_mode="connection")
    admin = LeaseTableAdmin(ddb, table)
    await admin.add("c0", "ws://127.0.0.1:9/c0")
    injector = LostReplies(ddb, match=is_claim, mode="timeout")
    injector.remaining = 1
    store = ConnectionStore(ddb, settings)
    with pytest.raises(AcquireUncertain) as caught:
        lossy = ConnectionStore(injector.as_client(), settings, call_timeout=0.5)
        await lossy.acquire("c0", settings.worker_id)
    [claimed] = await admin.list()
    late = AcquireUncertain(  # the same write, read back one local validity after it was sent
        "lost",
        connection_id="c0",
        sent_at=caught.value.sent_at - settings.local_validity_seconds,
        expires_at_ms=caught.value.expires_at_ms,
    )
    if stopped:
        await admin.stop("c0")
    leases = ConnectionLeases(store, SessionHeldStore(ddb, settings), settings)
    before = time.monotonic()
    adopted = await leases.resolve_uncertain(late)
    [item] = await admin.list()
    if stopped:
        assert adopted is None
        assert "lease_owner" not in item and int(item["lease_expires_at_ms"]) == 0, item
        return
    assert adopted is not None and adopted.lease.epoch == 1
    assert adopted.lease.is_valid(time.monotonic() + settings.heartbeat_seconds), "served until renewed"
    assert adopted.lease.valid_until >= before + settings.local_validity_seconds
    assert int(item["lease_expires_at_ms"]) > int(claimed["lease_expires_at_ms"]), "renewed in the table"
    assert item["lease_owner"] == settings.worker_id and item["lease_epoch"] == 1
