"""A hint for our own release, read before its entry left the registry, goes on to a peer.

A released connection's hint can be read (by a peer, or by the leaving worker's own last long
poll) before the send returns, while the settling session is still registered. It used to be
taken for a takeover ("connection removed or taken over") and dropped: the connection then
waited for a reconcile (bench/handoff_trace.py: 7 of 120 handoffs at 0.8-2.8 s). Real worker
parts, DynamoDB Local; the relay records what it passes on instead of sending it.

Such a hint is forwarded however often this worker has passed the same connection on lately: the
relay's bound (worker/relay.py) is for hints a full worker cannot take, and spent on a shed
connection's plain hints moments before, it dropped a SIGTERM release's hint (a 1.6 s handoff in
the fault suite, L2 1.5 s). That case runs on real SQS (moto) with the real relay.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import replace

import aioboto3
import pytest
from types_aiobotocore_dynamodb import DynamoDBClient
from types_aiobotocore_sqs import SQSClient

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.results import Acquired
from leaseworker.notify import Hint, Notifier, parse_message
from leaseworker.settings import Settings
from leaseworker.worker.main import build_worker
from leaseworker.worker.registry import Owned
from leaseworker.worker.relay import PASS_ON_LIMIT, HintRelay
from leaseworker.worker.session import ConnectionSession


class RecordingRelay(HintRelay):
    def __init__(self) -> None:
        super().__init__(Notifier(None, None))
        self.passed: list[tuple[str, bool]] = []

    async def pass_on(self, connection_id: str, *, handoff: bool = False) -> bool:
        self.passed.append((connection_id, handoff))
        return True

    async def forward(self, connection_id: str, *, handoff: bool = False) -> None:
        self.passed.append((connection_id, handoff))


async def test_a_hint_for_our_settled_release_is_passed_on(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    tuned = replace(settings, lease_mode="session", lease_seconds=20.0, heartbeat_seconds=5.0, sink="null")
    await LeaseTableAdmin(ddb, table).add("mine", "ws://127.0.0.1:1/feeds/mine")
    async with AsyncExitStack() as stack:
        worker, _ = await build_worker(tuned, stack)
        await worker._heartbeat.beat()  # our session is valid: claims may be made
        claimed = await worker._ownership.claim("mine")
        assert isinstance(claimed, Acquired)
        session = ConnectionSession(claimed.lease, worker._deps, worker._ownership.record_failure)
        owned = Owned(session)
        worker._registry.add(owned)
        relay = RecordingRelay()
        worker._hints._relay = relay

        # A hint for a connection we still serve, unchanged in the table: nothing to pass on.
        await worker._hints.on_changed(Hint("mine"))
        assert relay.passed == [] and not session.stop_requested.is_set()

        # The session ended and its release landed; the entry is still registered (settling).
        session.request_release("worker shutting down")
        owned.settling = True
        assert await worker._ownership.release(session.lease, -1)
        worker._stop_acquiring.set()  # leaving, as in a shutdown
        await worker._hints.on_changed(Hint("mine", handoff=True))
    assert relay.passed == [("mine", True)]


async def _drain(sqs: SQSClient, queue_url: str) -> list[Hint | None]:
    received: list[Hint | None] = []
    while True:
        response = await sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)
        messages = response.get("Messages", [])
        if not messages:
            return received
        received += [parse_message(m["Body"]) for m in messages]
        for message in messages:
            await sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])


@pytest.mark.parametrize("case", ["leaving", "settling"])
async def test_our_release_hint_is_forwarded_after_the_relay_bound_is_spent(
    ddb: DynamoDBClient, table: str, settings: Settings, moto_endpoint: str, case: str
) -> None:
    tuned = replace(settings, lease_mode="session", lease_seconds=20.0, heartbeat_seconds=5.0, sink="null")
    await LeaseTableAdmin(ddb, table).add("mine", "ws://127.0.0.1:1/feeds/mine")
    async with AsyncExitStack() as stack:
        sqs = await stack.enter_async_context(
            aioboto3.Session().client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1")
        )
        queue_url = (await sqs.create_queue(QueueName=f"forward-{table}"))["QueueUrl"]
        worker, _ = await build_worker(tuned, stack)
        relay = HintRelay(Notifier(sqs, queue_url))
        worker._hints._relay = relay
        await worker._heartbeat.beat()
        claimed = await worker._ownership.claim("mine")
        assert isinstance(claimed, Acquired)
        # The connection's plain hints bounced through us while we were full: the bound is spent.
        assert [await relay.pass_on("mine") for _ in range(PASS_ON_LIMIT + 1)] == [True] * PASS_ON_LIMIT + [
            False
        ]
        assert len(await _drain(sqs, queue_url)) == PASS_ON_LIMIT

        session = ConnectionSession(claimed.lease, worker._deps, worker._ownership.record_failure)
        owned = Owned(session)
        worker._registry.add(owned)
        handoff = case == "leaving"
        session.request_release("worker shutting down" if handoff else "rebalance: above fair share")
        owned.settling = True
        assert await worker._ownership.release(session.lease, -1)
        if handoff:  # the entry has left; our last long poll brings our own release's hint
            worker._registry.remove("mine")
            worker._stop_acquiring.set()
        await worker._hints.on_changed(Hint("mine", handoff=handoff))
        assert await _drain(sqs, queue_url) == [Hint("mine", handoff=handoff)]
