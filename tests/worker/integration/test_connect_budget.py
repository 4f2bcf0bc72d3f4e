"""The fleet's connect budget (lease/budget_store.py, worker/budget.py) against DynamoDB Local:
concurrent takers never spend more than the budget, nor lose tokens; a back-off reaches peers
that read the item before it; urgent takers go first; the write cost per connect."""

from __future__ import annotations

import asyncio
import json
import time

from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.budget_store import (
    HOLD_MS,
    SLACK_MS,
    STEPS,
    BudgetStore,
    host_key,
    now_ms,
    paced_seconds,
    paced_term_s,
)
from leaseworker.observability.metrics import WorkerMetrics
from leaseworker.worker.budget import COLD, URGENT, ConnectBudgets, Limit, priority_of
from leaseworker_dev.chaos.observe import effective_reading

HOST = "feed.example:443"


async def test_concurrent_takers_spend_the_budget_exactly(ddb: DynamoDBClient, table: str) -> None:
    """Eight takers (each its own store: its own copy of the item, as separate workers have) race
    for 40 tokens with far more demand: exactly 40 are granted before the first grant lapses."""
    count, seconds = 40, 30.0
    stores = [BudgetStore(ddb, table) for _ in range(8)]
    granted: list[int] = []

    async def taker(store: BudgetStore) -> None:
        while True:
            take = await store.take(HOST, 3, count=count, seconds=seconds, urgent=False)
            if take.tokens:
                granted.append(take.tokens)
            elif take.why == "budget spent":
                return

    async with asyncio.timeout(20):
        await asyncio.gather(*(taker(store) for store in stores))
    assert sum(granted) == count  # more would be a double spend, fewer a lost token
    item = (await ddb.get_item(TableName=table, Key={"connection_id": {"S": f"budget#{HOST}"}}))["Item"]
    logged = sum(int(g["L"][1]["N"]) for g in item["grants"]["L"])
    assert logged == count


async def test_sliding_window_frees_tokens_only_as_grants_lapse(ddb: DynamoDBClient, table: str) -> None:
    store = BudgetStore(ddb, table)
    before = now_ms()
    first = await store.take(HOST, 5, count=5, seconds=1.0, urgent=False)
    assert first.tokens == 5
    spent = await store.take(HOST, 1, count=5, seconds=1.0, urgent=False)
    assert spent.tokens == 0 and spent.why == "budget spent"
    # A grant lapses a window plus the hold and the slack after it was made (no earlier than
    # `before`), not sooner.
    assert spent.retry_at_ms >= before + 1000 + HOLD_MS + SLACK_MS
    await asyncio.sleep((spent.retry_at_ms - now_ms()) / 1000 + 0.05)
    assert (await store.take(HOST, 5, count=5, seconds=1.0, urgent=False)).tokens == 5


async def test_a_back_off_reaches_a_peer_that_read_before_it(ddb: DynamoDBClient, table: str) -> None:
    peer, refused = BudgetStore(ddb, table), BudgetStore(ddb, table)
    assert (await peer.take(HOST, 1, count=10, seconds=10, urgent=False)).tokens == 1  # peer has a copy
    until = now_ms() + 5_000
    await refused.back_off(HOST, until, "HTTP 429")
    await refused.back_off(HOST, until - 4_000, "HTTP 429")  # an earlier end never shortens it
    take = await peer.take(HOST, 1, count=10, seconds=10, urgent=True)  # its stale copy loses the race
    assert take.tokens == 0 and take.retry_at_ms == until and "HTTP 429" in take.why


async def test_cold_starts_yield_to_an_urgent_taker(ddb: DynamoDBClient, table: str) -> None:
    urgent, cold = BudgetStore(ddb, table), BudgetStore(ddb, table)
    assert (await urgent.take(HOST, 1, count=10, seconds=10, urgent=True)).tokens == 1
    take = await cold.take(HOST, 1, count=10, seconds=10, urgent=False)
    assert take.tokens == 0 and take.why == "yielding to takeovers"
    assert (await urgent.take(HOST, 1, count=10, seconds=10, urgent=True)).tokens == 1


async def test_a_worker_serves_takeovers_before_cold_starts(ddb: DynamoDBClient, table: str) -> None:
    budgets = ConnectBudgets(BudgetStore(ddb, table), WorkerMetrics(namespace="Test"))
    limit = Limit(HOST, 4, 2.0)
    order: list[str] = []

    async def connect(name: str, priority: int) -> None:
        await budgets.acquire(limit, priority)
        order.append(name)

    tasks = [asyncio.create_task(connect(f"cold{i}", COLD)) for i in range(4)]
    tasks += [asyncio.create_task(connect(f"urgent{i}", URGENT)) for i in range(4)]
    async with asyncio.timeout(15):
        await asyncio.gather(*tasks)
    await budgets.close()
    assert sorted(order[:4]) == [f"urgent{i}" for i in range(4)]
    assert priority_of("takeover") == URGENT and priority_of("connect") == COLD


async def test_write_cost_per_connect(ddb: DynamoDBClient, table: str) -> None:
    """Binance's budget (300 per 300 s): a takeover of 100 connections waiting at once takes its
    tokens in a write or two (the first waiter may take alone): at most 2/100 WRU per connect."""
    budgets = ConnectBudgets(BudgetStore(ddb, table), WorkerMetrics(namespace="Test"))
    limit = Limit(HOST, 300, 300.0)
    started = time.monotonic()
    async with asyncio.timeout(20):
        await asyncio.gather(*(budgets.acquire(limit, URGENT) for _ in range(100)))
    await budgets.close()
    assert time.monotonic() - started < 5
    per_connect = budgets.write_units / 100
    print(f"\nbudget cost, a takeover of 100: {budgets.write_units} WRU, {budgets.read_units} RCU")
    assert 0 < per_connect <= 0.02, per_connect  # takes of 1 WRU each (DynamoDB Local reports them)


def test_host_key_is_host_and_port() -> None:
    assert host_key("wss://Stream.Binance.com:9443/ws?x=1") == "stream.binance.com:9443"
    assert host_key("wss://ws-feed.exchange.coinbase.com") == "ws-feed.exchange.coinbase.com:443"
    assert host_key("ws://127.0.0.1:8080/feed") == "127.0.0.1:8080"


async def test_budget_items_are_neither_connections_nor_sessions(ddb: DynamoDBClient, table: str) -> None:
    """`budget#<host>` is a reserved key: listings and the chaos readings skip it."""
    assert (await BudgetStore(ddb, table).take(HOST, 1, count=10, seconds=10, urgent=False)).tokens == 1
    connections, sessions = await LeaseTableAdmin(ddb, table).snapshot()
    assert connections == [] and sessions == {}
    items = (await ddb.scan(TableName=table, ConsistentRead=True))["Items"]
    assert len(items) == 1 and effective_reading(items, now_ms()).checkpoints == {}


def test_the_takeover_bound_grows_by_the_budget_term() -> None:
    """L1 + (ceil(N/B) - 1) x (W + hold + slack), per host, the longest (docs/tuning.md)."""
    counted = 300 + (HOLD_MS + SLACK_MS) / 1000
    window = counted * (1 + 1 / STEPS)
    assert paced_seconds(300, 300, 300) == 0.0  # one batch: no wait
    assert paced_seconds(1000, 300, 300) == 3 * window
    binance = json.dumps({"budget": {"count": 300, "seconds": 300}})
    own_host = json.dumps({"budget": {"count": 300, "seconds": 300, "host": "nat-a"}})
    lost = [("wss://stream.binance.com:9443/stream", binance)] * 400 + [("ws://127.0.0.1:1/", None)] * 50
    assert paced_term_s(lost) == window
    # Split over two budget keys, each host's batch fits its own window.
    split = lost[:200] + [("wss://stream.binance.com:9443/stream", own_host)] * 200
    assert paced_term_s(split) == 0.0
    assert paced_term_s([("wss://x", "not json"), ("wss://x", '{"budget": 3}')]) == 0.0


async def test_one_write_unit_per_take_in_the_steady_state(ddb: DynamoDBClient, table: str) -> None:
    """Lone reconnects, one token each, spread over the window: the grant log stays at most
    about STEPS entries, so every take is one write unit, whatever the budget's count."""
    store = BudgetStore(ddb, table)
    units: list[float] = []
    for _ in range(60):
        take = await store.take(HOST, 1, count=300, seconds=1.0, urgent=False)
        assert take.tokens == 1
        units.append(take.write_units)
        await asyncio.sleep(0.02)
    item = (await ddb.get_item(TableName=table, Key={"connection_id": {"S": f"budget#{HOST}"}}))["Item"]
    assert len(item["grants"]["L"]) <= STEPS + 2
    assert max(units) == 1.0, units
    print(f"\nbudget cost, lone reconnects: {sum(units) / len(units)} WRU per connect")
