"""A worker's path to the in-memory DynamoDB, with the faults production has: latency, a
partition (every call hangs until its deadline), lost replies (applied, then no answer) and
death (nothing answers, ever). Every lease call has a deadline (lease/dynamodb.call_with_deadline),
so a hanging call ends as a StoreUnavailable, as it would against DynamoDB."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable
from typing import Any

from bench.simulator.memory_dynamodb import MemoryDynamoDB


class Link:
    def __init__(self, inner: MemoryDynamoDB, rng: random.Random, latency: tuple[float, float]) -> None:
        self._inner = inner
        self._rng = rng
        self._latency = latency
        self.partitioned_until = -math.inf
        self.lose_replies = 0.0  # probability that an applied call's reply is lost
        self.dead = False

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self._inner, name)

        async def call(**request: Any) -> Any:
            await asyncio.sleep(self._rng.uniform(*self._latency))
            if self.dead or asyncio.get_running_loop().time() < self.partitioned_until:
                await asyncio.Future()  # never answers: the caller's deadline ends it
            result = await method(**request)
            if self.lose_replies and self._rng.random() < self.lose_replies:
                await asyncio.Future()  # applied, but the reply never comes
            return result

        return call
