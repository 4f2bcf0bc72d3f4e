"""One event loop thread and one DynamoDB client for a local fleet's synchronous callers.

The system tests and the chaos runner read the lease table many times a second from
synchronous code (who owns what, the checkpoints, a worker's session). A fresh event loop and
client per call cost tens of milliseconds of CPU each: on two cores that was CPU taken from
the fleet under test (seen: the test process at half a core while a handoff was measured).
One long-lived loop and client serve every call, from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker_dev.local.services import local_dynamodb

T = TypeVar("T")
CALL_TIMEOUT_SECONDS = 60.0


class AdminLoop:
    def __init__(self, endpoint: str, table: str) -> None:
        self._endpoint = endpoint
        self._table = table
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fleet-admin", daemon=True)
        self._thread.start()
        self._clients = contextlib.AsyncExitStack()
        self._admin: LeaseTableAdmin | None = None

    def call(self, action: Callable[[LeaseTableAdmin], Awaitable[T]]) -> T:
        """Run `action` on the shared client and return its result (its exception, if it fails)."""
        future = asyncio.run_coroutine_threadsafe(self._run(action), self._loop)
        return future.result(CALL_TIMEOUT_SECONDS)

    async def _run(self, action: Callable[[LeaseTableAdmin], Awaitable[T]]) -> T:
        if self._admin is None:
            client = await self._clients.enter_async_context(local_dynamodb(self._endpoint))
            self._admin = LeaseTableAdmin(client, self._table)
        return await action(self._admin)

    def close(self) -> None:
        if not self._loop.is_running():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._clients.aclose(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
