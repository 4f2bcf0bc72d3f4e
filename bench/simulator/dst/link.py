"""A worker's path to the in-memory DynamoDB, with the faults production has: latency, slow
replies (a latency spike), throttling, a partition (every call hangs until its deadline), lost
replies (applied, then no answer) and death (nothing answers, ever). Every lease call has a
deadline (lease/dynamodb.call_with_deadline), so a hanging call ends as a StoreUnavailable, as it
would against DynamoDB."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable
from typing import Any

from bench.simulator.memory_dynamodb import MemoryDynamoDB, client_error

THROTTLED = "ProvisionedThroughputExceededException"


class Link:
    def __init__(self, inner: MemoryDynamoDB, rng: random.Random, latency: tuple[float, float]) -> None:
        self._inner = inner
        self.meter = inner.meter  # the units this worker's calls were charged
        self._rng = rng
        self._latency = latency
        self.partitioned_until = -math.inf
        self.slow_until = -math.inf  # until then each call takes `slow_seconds` more
        self.slow_seconds = 0.0
        self.throttled_until = -math.inf  # until then a call is refused with `throttle_share`
        self.throttle_share = 0.0
        self.lose_replies = 0.0  # probability that an applied call's reply is lost
        self.dead = False

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self._inner, name)

        async def call(**request: Any) -> Any:
            loop = asyncio.get_running_loop()
            delay = self._rng.uniform(*self._latency)
            if loop.time() < self.slow_until:
                delay += self.slow_seconds
            await asyncio.sleep(delay)
            now = loop.time()
            if self.dead or now < self.partitioned_until:
                await asyncio.Future()  # never answers: the caller's deadline ends it
            if now < self.throttled_until and self._rng.random() < self.throttle_share:
                raise client_error(THROTTLED, "Rate of requests exceeds the allowed throughput", name)
            result = await method(**request)
            if self.lose_replies and self._rng.random() < self.lose_replies:
                await asyncio.Future()  # applied, but the reply never comes
            return result

        return call
