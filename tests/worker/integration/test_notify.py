"""SQS notifications against a moto server: the wire format, malformed input, and failure bounds."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator

import aioboto3
import pytest
from aiobotocore.config import AioConfig
from types_aiobotocore_sqs import SQSClient

from leaseworker.notify import Hint, Notifier, encode_message, notifications, parse_message
from leaseworker.observability.logging import configure_logging


@pytest.fixture
async def sqs(moto_endpoint: str) -> AsyncIterator[SQSClient]:
    async with aioboto3.Session().client(
        "sqs", endpoint_url=moto_endpoint, region_name="us-east-1"
    ) as client:
        yield client


@pytest.fixture
async def queue_url(sqs: SQSClient) -> str:
    response = await sqs.create_queue(QueueName=f"notify-{uuid.uuid4().hex[:8]}")
    return response["QueueUrl"]


async def collect(sqs: SQSClient, queue_url: str, count: int, *, within: float = 10.0) -> list[str]:
    """Read `count` ids from the iterator, then stop it and check that it ends."""
    stop = asyncio.Event()
    got: list[str] = []
    async with asyncio.timeout(within):
        async for hint in notifications(sqs, queue_url, wait_seconds=1, stop=stop):
            got.append(hint.connection_id)
            if len(got) == count:
                stop.set()
    return got


async def queue_depth(sqs: SQSClient, queue_url: str) -> int:
    attributes = await sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )
    values = attributes["Attributes"]
    return int(values["ApproximateNumberOfMessages"]) + int(values["ApproximateNumberOfMessagesNotVisible"])


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_wire_format_is_exact() -> None:
    assert encode_message("feed-1") == '{"type":"connection_changed","connection_id":"feed-1"}'
    assert parse_message(encode_message("a.b:c_d-9")) == Hint("a.b:c_d-9")
    handoff = '{"type":"connection_changed","connection_id":"feed-1","reason":"handoff"}'
    assert encode_message("feed-1", handoff=True) == handoff
    assert parse_message(handoff) == Hint("feed-1", handoff=True)
    # A reason this version does not know is a plain hint, not a malformed message.
    assert parse_message('{"type":"connection_changed","connection_id":"f","reason":"x"}') == Hint("f")


async def test_a_handoff_survives_a_plain_duplicate_in_one_batch(sqs: SQSClient, queue_url: str) -> None:
    await sqs.send_message(QueueUrl=queue_url, MessageBody=encode_message("dup"))
    await sqs.send_message(QueueUrl=queue_url, MessageBody=encode_message("dup", handoff=True))
    await sqs.send_message(QueueUrl=queue_url, MessageBody=encode_message("dup"))
    stop = asyncio.Event()
    got: list[Hint] = []
    async with asyncio.timeout(10):
        async for hint in notifications(sqs, queue_url, wait_seconds=1, stop=stop):
            got.append(hint)
            if hint.handoff:
                stop.set()
    assert got[-1] == Hint("dup", handoff=True)


@pytest.mark.parametrize(
    "body",
    [
        "not json",
        "[]",
        '"connection_changed"',
        '{"type":"other","connection_id":"x"}',
        '{"type":"connection_changed"}',
        '{"type":"connection_changed","connection_id":7}',
        '{"type":"connection_changed","connection_id":""}',
        '{"type":"connection_changed","connection_id":"has space"}',
        '{"type":"connection_changed","connection_id":"' + "x" * 129 + '"}',
    ],
)
def test_parse_rejects_malformed(body: str) -> None:
    assert parse_message(body) is None


async def test_round_trip_sends_the_exact_body(sqs: SQSClient, queue_url: str) -> None:
    await Notifier(sqs, queue_url).connection_changed("feed-1")

    raw = await sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=1, MaxNumberOfMessages=10)
    bodies = [message["Body"] for message in raw.get("Messages", [])]
    assert bodies == ['{"type":"connection_changed","connection_id":"feed-1"}']
    assert json.loads(bodies[0]) == {"type": "connection_changed", "connection_id": "feed-1"}


async def test_iterator_yields_ids_and_deletes_messages(sqs: SQSClient, queue_url: str) -> None:
    notifier = Notifier(sqs, queue_url)
    for connection_id in ("feed-1", "feed-2", "feed-3"):
        await notifier.connection_changed(connection_id)

    got = await collect(sqs, queue_url, 3)

    assert sorted(got) == ["feed-1", "feed-2", "feed-3"]
    assert await queue_depth(sqs, queue_url) == 0


async def test_malformed_messages_are_deleted_and_skipped(sqs: SQSClient, queue_url: str) -> None:
    for body in ("garbage", '{"type":"other"}', '{"type":"connection_changed","connection_id":"bad id"}'):
        await sqs.send_message(QueueUrl=queue_url, MessageBody=body)
    await Notifier(sqs, queue_url).connection_changed("good-1")

    logs = io.StringIO()
    configure_logging("INFO", logs)
    try:
        got = await collect(sqs, queue_url, 1)
    finally:
        configure_logging("INFO")

    assert got == ["good-1"]
    # A batch is deleted before its ids are yielded: nothing is left, malformed or not.
    assert await queue_depth(sqs, queue_url) == 0
    dropped = [json.loads(line) for line in logs.getvalue().splitlines()]
    dropped = [line for line in dropped if line["message"] == "dropping a malformed notification"]
    assert sorted(line["body"] for line in dropped) == sorted(
        ["garbage", '{"type":"other"}', '{"type":"connection_changed","connection_id":"bad id"}']
    )


async def test_no_queue_is_a_noop() -> None:
    assert not Notifier(None, None).enabled
    await Notifier(None, None).connection_changed("feed-1")
    await Notifier(None, "https://sqs.example/queue").connection_changed("feed-1")


async def test_unreachable_endpoint_returns_within_timeout() -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    config = AioConfig(retries={"max_attempts": 10, "mode": "standard"}, connect_timeout=5)
    async with aioboto3.Session().client(
        "sqs", endpoint_url=endpoint, region_name="us-east-1", config=config
    ) as client:
        notifier = Notifier(client, f"{endpoint}/123456789012/nowhere", timeout=0.5)
        started = time.monotonic()
        await notifier.connection_changed("feed-1")  # must not raise
        elapsed = time.monotonic() - started
    assert elapsed < 1.5


async def test_iterator_survives_errors_and_stops_promptly() -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    config = AioConfig(retries={"max_attempts": 1}, connect_timeout=1)
    async with aioboto3.Session().client(
        "sqs", endpoint_url=endpoint, region_name="us-east-1", config=config
    ) as client:
        stop = asyncio.Event()

        async def consume() -> list[Hint]:
            return [h async for h in notifications(client, f"{endpoint}/1/q", wait_seconds=1, stop=stop)]

        task = asyncio.create_task(consume())
        await asyncio.sleep(1.0)  # several failures and backoffs, none of which may end the loop
        assert not task.done()
        stop.set()
        started = time.monotonic()
        assert await asyncio.wait_for(task, timeout=3) == []
    assert time.monotonic() - started < 1.0


async def test_iterator_stops_within_the_long_poll(sqs: SQSClient, queue_url: str) -> None:
    stop = asyncio.Event()

    async def consume() -> list[Hint]:
        return [hint async for hint in notifications(sqs, queue_url, wait_seconds=1, stop=stop)]

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.3)  # inside a long poll on an empty queue
    stop.set()
    started = time.monotonic()
    assert await asyncio.wait_for(task, timeout=5) == []
    assert time.monotonic() - started < 1 + 1.0
