"""A worker claims nothing while its own session is past its deadline (worker/acquirer.py).

Peers fence a worker whose heartbeat stands still. A claim it sends meanwhile may still land:
in the fault suite's ddb_stall (CI rehearsal, 2026-12-07) a worker cut off from DynamoDB lost its
leases to its own deadline, re-claimed one of them through the stalled path, and the claim
landed as it was being fenced. The connection then waited for that worker's give-back at
shutdown: 11.1 s without an owner, against L1's 5.9 s.

Here a real worker on DynamoDB Local has its session heartbeats refused (every other call goes
through): once its session's deadline has passed, free connections are added; it must claim none
of them, and none may name it in the table. Once its heartbeats land again it claims them all.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import Any

import pytest
from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.clock import monotonic
from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.errors import StoreUnavailable
from leaseworker.settings import Settings
from leaseworker.worker.main import build_worker
from leaseworker_dev.feed.server import FeedServer
from tests.worker.harness import eventually

CONNECTIONS = 4


class RefusedHeartbeats:
    """The worker's real session store; its heartbeats fail while `refusing` is set."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.refusing = False

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def heartbeat(self, *args: Any, **kwargs: Any) -> Any:
        if self.refusing:
            raise StoreUnavailable("heartbeat refused by the test")
        return await self._inner.heartbeat(*args, **kwargs)


@pytest.mark.parametrize("mode", ["connection", "session"])
async def test_a_worker_past_its_session_deadline_claims_nothing(
    ddb: DynamoDBClient, table: str, settings: Settings, mode: str
) -> None:
    admin = LeaseTableAdmin(ddb, table)
    tuned = replace(
        settings,
        worker_id="cut-off",
        lease_mode=mode,  # type: ignore[arg-type]
        reconcile_seconds=0.5,  # the fixture's lease 3 s, heartbeat 1 s otherwise
        sink="null",
    )
    async with FeedServer() as feed, AsyncExitStack() as stack:
        worker, _ = await build_worker(tuned, stack)
        sessions = RefusedHeartbeats(worker._heartbeat._sessions)
        worker._heartbeat._sessions = sessions  # type: ignore[assignment]
        validity = worker._coordination.validity
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        try:
            await eventually(lambda: validity.is_valid(monotonic()), 10, "a first heartbeat")
            sessions.refusing = True
            await eventually(lambda: not validity.is_valid(monotonic()), 10, "the session's deadline")
            ids = [f"free-{i}" for i in range(CONNECTIONS)]
            for cid in ids:
                await admin.add(cid, feed.url_for(cid))
            await asyncio.sleep(6 * tuned.reconcile_seconds)  # several reconciles, each finding them free
            assert worker.owned == [], worker.owned
            assert worker.claiming == []
            items = {item["connection_id"]: item for item in await admin.list()}
            assert not [cid for cid in ids if items[cid].get("lease_owner")], items
            sessions.refusing = False
            await eventually(lambda: len(worker.owned) == CONNECTIONS, 15, "every connection claimed")
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
