"""The hint relay (docs/design.md §6): a hint we have no room for is re-sent, boundedly, on real SQS."""

from __future__ import annotations

import aioboto3

from leaseworker.notify import Hint, Notifier, parse_message
from leaseworker.worker.relay import PASS_ON_LIMIT, HintRelay


async def test_a_hint_is_passed_on_at_most_the_limit_per_window(moto_endpoint: str) -> None:
    session = aioboto3.Session()
    async with session.client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1") as sqs:
        queue_url = (await sqs.create_queue(QueueName="relay-bound"))["QueueUrl"]
        relay = HintRelay(Notifier(sqs, queue_url))
        sent = [await relay.pass_on("c-1") for _ in range(PASS_ON_LIMIT + 2)]
        assert sent == [True] * PASS_ON_LIMIT + [False, False]
        assert await relay.pass_on("c-2", handoff=True)  # the bound is per connection
        received: list[Hint | None] = []
        while True:
            response = await sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)
            messages = response.get("Messages", [])
            if not messages:
                break
            received += [parse_message(m["Body"]) for m in messages]
            for message in messages:
                await sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
    assert sorted(received, key=str) == [Hint("c-1")] * PASS_ON_LIMIT + [Hint("c-2", handoff=True)]
