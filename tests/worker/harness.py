"""Run a real worker in-process for integration tests: the same wiring as `leaseworker run`."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.observability.metrics import WorkerMetrics
from leaseworker.settings import Settings
from leaseworker.sinks.base import Sink
from leaseworker.worker.app import Worker
from leaseworker.worker.main import build_worker


@dataclass
class Running:
    worker: Worker
    metrics: WorkerMetrics
    task: asyncio.Task[None]


@asynccontextmanager
async def running(
    settings: Settings,
    *,
    sink: Sink | None = None,
    wrap_dynamodb: Callable[[DynamoDBClient], DynamoDBClient] | None = None,
) -> AsyncIterator[Running]:
    stop = asyncio.Event()
    async with AsyncExitStack() as stack:
        worker, metrics = await build_worker(
            settings, stack, metrics_stream=io.StringIO(), sink=sink, wrap_dynamodb=wrap_dynamodb
        )
        task = asyncio.create_task(worker.run(stop))
        try:
            yield Running(worker, metrics, task)
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)


async def eventually(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate() if asyncio.iscoroutinefunction(predicate) else predicate():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")
