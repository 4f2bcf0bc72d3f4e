"""A connect storm against a rate-limited replay (feed/replays/limits.py): two workers' budgets
(one table on DynamoDB Local) keep it within the limit; without them it is refused (429, then a
418 ban); a refusal's Retry-After backs the host off for the fleet."""

from __future__ import annotations

import asyncio

import pytest
from types_aiobotocore_dynamodb import DynamoDBClient
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from leaseworker.lease.budget_store import BudgetStore, host_key, now_ms
from leaseworker.observability.metrics import MetricName, WorkerMetrics
from leaseworker.worker import upstream
from leaseworker.worker.budget import RECONNECT, URGENT, ConnectBudgets, Limit
from leaseworker_dev.feed.replays import ReplayServer
from leaseworker_dev.feed.replays.limits import ConnectLimit, peak_in_window

COUNT, SECONDS = 10, 1.0
CONNECTS = 30


async def _storm(server: ReplayServer, budgets: list[ConnectBudgets] | None) -> list[int]:
    """CONNECTS connects to the replay, from two workers; the HTTP statuses of the refusals."""
    limit = Limit(host_key(server.url), COUNT, SECONDS)
    refusals: list[int] = []

    async def one(i: int) -> None:
        if budgets is not None:
            await budgets[i % 2].acquire(limit, URGENT if i % 3 == 0 else RECONNECT)
        try:
            async with connect(server.url, open_timeout=10):
                pass
        except InvalidStatus as error:
            refusals.append(error.response.status_code)

    async with asyncio.timeout(30):
        await asyncio.gather(*(one(i) for i in range(CONNECTS)))
    return refusals


async def test_budgets_keep_a_storm_within_the_limit(ddb: DynamoDBClient, table: str) -> None:
    metrics = WorkerMetrics(namespace="Test")
    budgets = [ConnectBudgets(BudgetStore(ddb, table), metrics) for _ in range(2)]
    async with ReplayServer(feed="jetstream", host_limit=ConnectLimit(COUNT, SECONDS)) as server:
        refusals = await _storm(server, budgets)
        opens = [e.t_ms for e in server.ledger.of_kind("open")]
    for b in budgets:
        await b.close()
    assert refusals == []
    assert len(opens) == CONNECTS
    assert peak_in_window(opens, SECONDS) <= COUNT
    # The storm took about (CONNECTS / COUNT - 1) windows of SECONDS plus the hold and slack.
    assert (max(opens) - min(opens)) / 1000 >= 2 * SECONDS
    assert metrics.totals()[MetricName.ConnectsDeferred] >= CONNECTS - COUNT


async def test_without_budgets_the_storm_is_refused() -> None:
    """The negative control: the same storm, unpaced, meets 429s and then a 418 ban."""
    async with ReplayServer(feed="jetstream", host_limit=ConnectLimit(COUNT, SECONDS)) as server:
        refusals = await _storm(server, None)
    assert 429 in refusals and 418 in refusals
    assert len(refusals) == CONNECTS - COUNT


async def test_a_refusal_backs_the_host_off_for_the_fleet(ddb: DynamoDBClient, table: str) -> None:
    async with ReplayServer(feed="jetstream", host_limit=ConnectLimit(1, 60.0)) as server:
        async with connect(server.url):
            pass
        with pytest.raises(InvalidStatus) as refused:
            async with connect(server.url):
                pass
    status = upstream.refusal_status(refused.value)
    retry_after = upstream.refusal_retry_after(refused.value)
    assert status == 429 and retry_after is not None and 58 <= retry_after <= 60
    limit = Limit(host_key(server.url), 100, 10.0)
    refusing = ConnectBudgets(BudgetStore(ddb, table), WorkerMetrics(namespace="Test"))
    await refusing.refused(limit, status, retry_after)
    take = await BudgetStore(ddb, table).take(limit.host, 1, count=100, seconds=10.0, urgent=True)
    assert take.tokens == 0 and "HTTP 429" in take.why
    assert take.retry_at_ms >= now_ms() + 55_000
