"""The handoff's SQS path against a moto server: hints sent in coalesced batches, and hints
yielded while their delete is still in flight (bench/handoff_trace.py found both on P2's path)."""

from __future__ import annotations

import asyncio
import io
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import aioboto3
import pytest
from types_aiobotocore_sqs import SQSClient

from leaseworker.notify import MAX_MESSAGES, Hint, Notifier, encode_message, notifications
from leaseworker.observability.logging import configure_logging
from leaseworker_dev.local.proxy import TcpProxy


@pytest.fixture
async def sqs(moto_endpoint: str) -> AsyncIterator[SQSClient]:
    async with aioboto3.Session().client(
        "sqs", endpoint_url=moto_endpoint, region_name="us-east-1"
    ) as client:
        yield client


@pytest.fixture
async def queue_url(sqs: SQSClient) -> str:
    response = await sqs.create_queue(QueueName=f"batching-{uuid.uuid4().hex[:8]}")
    return response["QueueUrl"]


def count_calls(client: SQSClient, operation: str, when: str = "before-call") -> list[str]:
    """Every `operation` request the client makes, as it makes it (botocore's event hooks)."""
    calls: list[str] = []

    def record(**_: Any) -> None:
        calls.append(operation)

    client.meta.events.register(f"{when}.sqs.{operation}", record)
    return calls


async def drain(sqs: SQSClient, queue_url: str, expected: int) -> list[str]:
    bodies: list[str] = []
    async with asyncio.timeout(10):
        while len(bodies) < expected:
            response = await sqs.receive_message(
                QueueUrl=queue_url, WaitTimeSeconds=1, MaxNumberOfMessages=10
            )
            messages = response.get("Messages", [])
            bodies += [message["Body"] for message in messages]
            if messages:
                await sqs.delete_message_batch(
                    QueueUrl=queue_url,
                    Entries=[
                        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
                    ],
                )
    return bodies


async def test_a_burst_of_hints_goes_out_in_few_batches(sqs: SQSClient, queue_url: str) -> None:
    """25 releases landing together (a leaving worker's): every hint arrives, byte for byte,
    in at most 1 + ceil(24 / 10) requests instead of 25; every caller returns once its own
    hint is sent."""
    batches = count_calls(sqs, "SendMessageBatch")
    singles = count_calls(sqs, "SendMessage")
    notifier = Notifier(sqs, queue_url)
    ids = [f"burst-{n:02d}" for n in range(25)]

    await asyncio.gather(*(notifier.connection_changed(cid, handoff=True) for cid in ids))

    assert singles == []
    assert 1 <= len(batches) <= 1 + -(-24 // MAX_MESSAGES)
    bodies = await drain(sqs, queue_url, len(ids))
    assert sorted(bodies) == sorted(encode_message(cid, handoff=True) for cid in ids)


async def test_one_hint_alone_leaves_at_once(sqs: SQSClient, queue_url: str) -> None:
    batches = count_calls(sqs, "SendMessageBatch")
    await Notifier(sqs, queue_url).connection_changed("alone")
    assert len(batches) == 1
    assert await drain(sqs, queue_url, 1) == [encode_message("alone")]


async def test_the_same_id_twice_is_sent_twice(sqs: SQSClient, queue_url: str) -> None:
    """Two hints for one connection (a plain one, then a handoff) are two messages: neither may
    swallow the other while they wait for the same send."""
    notifier = Notifier(sqs, queue_url)
    await asyncio.gather(
        notifier.connection_changed("held"),  # takes the send at once
        notifier.connection_changed("twice"),
        notifier.connection_changed("twice", handoff=True),
    )
    bodies = await drain(sqs, queue_url, 3)
    assert sorted(bodies) == sorted(
        [encode_message("held"), encode_message("twice"), encode_message("twice", handoff=True)]
    )


async def test_hints_are_yielded_before_their_delete_lands(sqs: SQSClient, queue_url: str) -> None:
    """The delete of a received batch overlaps the handling of its hints (one round trip less
    on a handoff's path), and still lands before the iterator ends: nothing is left queued."""
    await Notifier(sqs, queue_url).connection_changed("fast", handoff=True)
    deleted = count_calls(sqs, "DeleteMessageBatch", when="after-call")
    stop = asyncio.Event()
    seen_with_deletes: list[int] = []
    got: list[Hint] = []
    async with asyncio.timeout(10):
        async for hint in notifications(sqs, queue_url, wait_seconds=1, stop=stop):
            seen_with_deletes.append(len(deleted))
            got.append(hint)
            stop.set()
    assert got == [Hint("fast", handoff=True)]
    assert seen_with_deletes == [0]  # yielded before its delete had answered
    assert len(deleted) == 1  # ... which the iterator awaited before it ended
    attributes = await sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )
    assert sum(int(v) for v in attributes["Attributes"].values()) == 0


TIMEOUT_S = 3.0


async def test_a_leaving_workers_burst_arrives_whole_over_a_slow_link(
    sqs: SQSClient, queue_url: str, moto_endpoint: str
) -> None:
    """A burst of 70 hints (a leaving worker's) through a link of about 0.5 s a round trip:
    every hint arrives within the notifier's timeout (3 s here). One batch at a time that took 8
    round trips (about 4 s) and the last batches timed out, their connections left to a
    reconcile (a worker leaving with 400 connections against the local SQS lost 129 hints so);
    in rounds of SENDERS batches it takes 2 (1.3-1.6 s measured, with a CPU-bound process
    beside it)."""
    target = urlsplit(moto_endpoint)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 80)
    await proxy.start()
    ids = [f"leaving-{n:02d}" for n in range(7 * MAX_MESSAGES)]
    logs = io.StringIO()
    try:
        async with aioboto3.Session().client("sqs", endpoint_url=proxy.url, region_name="us-east-1") as slow:
            await slow.get_queue_attributes(QueueUrl=queue_url)  # its connection is made before the fault
            proxy.latency = 0.25  # each way
            configure_logging("INFO", logs)
            try:
                notifier = Notifier(slow, queue_url, timeout=TIMEOUT_S)
                await asyncio.gather(*(notifier.connection_changed(cid, handoff=True) for cid in ids))
            finally:
                configure_logging("INFO")
    finally:
        await proxy.stop()
    lost = [line for line in logs.getvalue().splitlines() if "peers will see the change" in line]
    assert lost == [], lost[:3]
    bodies = await drain(sqs, queue_url, len(ids))
    assert len(bodies) == len(ids)
