"""Each preset, expanded with url= pointing at its local replay, driven over real WebSockets by
the generic/1 adapter (driver.py), and checked against what the replay says it sent (its
ledger): nothing invented or doubled, everything sent before a delivered message delivered
(TCP keeps order), and every hole in a key's ids marked by a gap record between the records
that bound it. Jetstream resumes from its cursor and loses nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from websockets.asyncio.client import connect

from leaseworker.protocol.adapter import Reconnect
from leaseworker.protocol.generic import GenericProtocol
from leaseworker.protocol.presets import expand
from leaseworker_dev.feed.replays import Entry, Ledger, ReplayServer, binance, coinbase, kraken
from leaseworker_dev.feed.replays.home_assistant import event_number
from leaseworker_dev.feed.replays.jetstream import Jetstream
from tests.worker.feeds.driver import Driver, Record, start, stop

RATE = 40.0  # data messages per second per key: enough to lose some in a drop, cheap on 2 cores
OUTAGE_S = 0.3  # how long nobody listens after a drop (the driver reconnects after 50 ms)
Ident = tuple[str | None, int]


async def drop_and_resume(server: ReplayServer, driver: Driver, *, before: int = 15, after: int = 15) -> None:
    """Let `before` records arrive, drop the socket (abort), and wait for `after` more on a new one."""
    await driver.wait_for(lambda d: len(d.data()) >= before)
    assert await server.drop("abort") == 1
    await asyncio.sleep(OUTAGE_S)
    count = len(driver.data())
    await driver.wait_for(lambda d: d.readies >= 2 and len(d.data()) >= count + after)


def check_against_ledger(
    driver: Driver,
    ledger: Ledger,
    ident: Callable[[Record], Ident],
    entry_ident: Callable[[Entry], Ident],
) -> None:
    records = driver.data()
    delivered = [ident(r) for r in records]
    assert len(set(delivered)) == len(delivered), "a message was delivered twice"
    sent = {entry_ident(e) for e in ledger.data()}
    assert set(delivered) <= sent, f"delivered but never sent: {sorted(set(delivered) - sent)[:5]}"
    got = set(delivered)
    for conn in ledger.connections():
        entries = [entry_ident(e) for e in ledger.data(conn=conn)]
        reached = [i for i, e in enumerate(entries) if e in got]
        if reached:
            missing = [e for e in entries[: reached[-1] + 1] if e not in got]
            assert not missing, (
                f"connection {conn}: sent before a delivered message, never delivered: {missing[:5]}"
            )
    # Every hole in a key's ids lies between two records with a gap marker (of that key, or of
    # the whole connection) between them: a consumer can tell "quiet" from "lost".
    last: dict[str | None, tuple[int, int]] = {}  # key -> (n, record position)
    for position, record in enumerate(driver.records):
        if record.kind != "data":
            continue
        key, n = ident(record)
        if key in last and n != last[key][0] + 1:
            between = driver.records[last[key][1] + 1 : position]
            marked = [g for g in between if g.kind == "gap" and g.data.get("key") in (None, key)]
            assert marked, f"hole {last[key][0]}..{n} of {key} has no gap marker"
        last[key] = (n, position)


def only_reconnect(driver: Driver) -> Reconnect:
    (end,) = driver.ends
    assert isinstance(end, Reconnect), end
    return end


def reasons(driver: Driver) -> list[str]:
    return [g.data["reason"] for g in driver.gaps()]


# ------------------------------------------------------------------------------------ jetstream


async def test_jetstream_resumes_from_its_cursor_without_loss() -> None:
    async with ReplayServer(feed="jetstream", rate=50) as server:
        config = expand("jetstream", {"url": server.url, "collections": "app.bsky.feed.post"})
        driver = Driver(GenericProtocol(config))
        task = await start(driver)
        try:
            await drop_and_resume(server, driver)
        finally:
            await stop(task)
    feed = server.feed
    assert isinstance(feed, Jetstream)
    assert driver.gaps() == []  # a resumable feed has no hole to mark
    times = [r.cursor for r in driver.data()]
    assert times == sorted(set(times))
    first, last = ((t - feed.t0_us) * 50 // 1_000_000 for t in (times[0], times[-1]))
    expected = [feed.event(n, feed.time_us(n)) for n in range(first, last + 1)]
    expected = [e for e in expected if feed.wanted(e, ["app.bsky.feed.post"], set())]
    assert [r.data for r in driver.data()] == expected  # account/identity events come regardless
    assert {e["kind"] for e in expected} >= {"commit", "identity", "account"}
    assert driver.dropped >= 1  # the inclusive cursor's overlap, dropped as a replay
    assert "cursor=" in server.ledger.of_kind("open")[1].message


# -------------------------------------------------------------------------------- coinbase


def coinbase_ident(record: Record) -> Ident:
    return record.key, record.cursor - coinbase.TRADE_ID_BASE


def coinbase_entry(entry: Entry) -> Ident:
    return entry.key, entry.cursor - coinbase.TRADE_ID_BASE


async def test_coinbase_drop_is_marked_and_trade_ids_check_the_rest() -> None:
    async with ReplayServer(feed="coinbase-exchange", rate=RATE) as server:
        config = expand("coinbase-exchange", {"url": server.url, "product_ids": "BTC-USD,ETH-USD"})
        driver = Driver(GenericProtocol(config))
        task = await start(driver)
        try:
            await drop_and_resume(server, driver)
            server.skip(1)  # one match lost inside a socket: a keyed seq_gap with exact bounds
            count = len(driver.data())
            await driver.wait_for(lambda d: "seq_gap" in reasons(d) and len(d.data()) >= count + 4)
        finally:
            await stop(task)
    check_against_ledger(driver, server.ledger, coinbase_ident, coinbase_entry)
    assert reasons(driver)[:2] == ["connect", "reconnect"]
    (skipped,) = server.ledger.of_kind("skipped")
    (gap,) = [g for g in driver.gaps() if g.data["reason"] == "seq_gap"]
    assert gap.data["key"] == skipped.key
    assert gap.data["from_cursor"] == skipped.cursor - 1
    assert gap.data["to_cursor"] == skipped.cursor + 1


async def test_coinbase_refuses_an_unknown_product() -> None:
    async with ReplayServer(feed="coinbase-exchange", rate=RATE) as server:
        config = expand("coinbase-exchange", {"url": server.url, "product_ids": "NOPE-USD"})
        driver = Driver(GenericProtocol(config))
        await driver.run(max_sockets=1)
    end = only_reconnect(driver)
    assert end.kind == "error" and "NOPE-USD" in end.reason


# --------------------------------------------------------------------------------- binance


def binance_ident(record: Record) -> Ident:
    return binance_entry_of(record.data)


def binance_entry(entry: Entry) -> Ident:
    return binance_entry_of(entry.message)


def binance_entry_of(message: dict[str, Any]) -> Ident:
    data = message["data"]
    if data["e"] == "trade":
        return message["stream"], data["t"] - binance.TRADE_ID_BASE
    return message["stream"], (data["U"] - binance.UPDATE_ID_BASE) // binance.UPDATE_IDS_PER_EVENT


async def test_binance_depth_ranges_and_drops_are_marked() -> None:
    async with ReplayServer(feed="binance-spot", rate=RATE) as server:
        streams = "btcusdt@depth@100ms,btcusdt@trade"
        config = expand("binance-spot", {"url": server.url, "streams": streams})
        assert config["lifetime"]["max_age_s"] < 24 * 3600
        driver = Driver(GenericProtocol(config))
        task = await start(driver)
        try:
            await drop_and_resume(server, driver)
        finally:
            await stop(task)
    check_against_ledger(driver, server.ledger, binance_ident, binance_entry)
    assert {r.key for r in driver.data()} == {"btcusdt@depth@100ms", "btcusdt@trade"}
    assert "?streams=btcusdt@depth@100ms/btcusdt@trade" in server.ledger.of_kind("open")[0].message


async def test_binance_lost_depth_update_is_a_keyed_gap() -> None:
    async with ReplayServer(feed="binance-spot", rate=RATE) as server:
        config = expand("binance-spot", {"url": server.url, "streams": "ethusdt@depth@100ms"})
        driver = Driver(GenericProtocol(config))
        task = await start(driver)
        try:
            await driver.wait_for(lambda d: len(d.data()) >= 3)
            server.skip(1)
            await driver.wait_for(lambda d: "seq_gap" in reasons(d) and len(d.data()) >= 5)
        finally:
            await stop(task)
    check_against_ledger(driver, server.ledger, binance_ident, binance_entry)
    (gap,) = [g for g in driver.gaps() if g.data["reason"] == "seq_gap"]
    (skipped,) = server.ledger.of_kind("skipped")
    assert gap.data["key"] == "ethusdt@depth@100ms"
    assert gap.data["from_cursor"] == skipped.message["data"]["U"] - 1  # the u before the hole


async def test_binance_connection_limit_is_a_limit_refusal() -> None:
    async with ReplayServer(feed="binance-spot", rate=RATE, connect_limit=(1, 60.0)) as server:
        config = expand("binance-spot", {"url": server.url, "streams": "btcusdt@trade"})
        driver = Driver(GenericProtocol(config))
        task = await start(driver, max_sockets=2)
        try:
            await driver.wait_for(lambda d: len(d.data()) >= 2)
            await server.drop("close", 1001)
            await driver.wait_for(lambda d: len(d.ends) == 2)
        finally:
            await stop(task)
    second = driver.ends[1]
    assert (
        isinstance(second, Reconnect) and second.kind == "limit"
    )  # HTTP 429: back off, never fail the connection
    assert [e.code for e in server.ledger.of_kind("refused")] == [429]


async def test_binance_cuts_connections_at_their_max_age() -> None:
    async with ReplayServer(feed="binance-spot", rate=RATE, max_age_s=0.4) as server:
        config = expand("binance-spot", {"url": server.url, "streams": "btcusdt@trade"})
        driver = Driver(GenericProtocol(config))
        task = await start(driver)
        try:
            # The second socket's marker is placed with its first record: wait for it, not
            # for a count that the first socket alone may reach.
            await driver.wait_for(
                lambda d: d.readies >= 2 and len(d.data()) >= 20 and "reconnect" in reasons(d)
            )
        finally:
            await stop(task)
    check_against_ledger(driver, server.ledger, binance_ident, binance_entry)
    assert "reconnect" in reasons(driver)


# ---------------------------------------------------------------------------------- kraken


def kraken_ident(record: Record) -> Ident:
    return record.key, record.cursor - kraken.TRADE_ID_BASE


def kraken_entry(entry: Entry) -> Ident:
    return entry.key, entry.cursor - kraken.TRADE_ID_BASE


async def test_kraken_snapshot_fills_a_short_outage() -> None:
    async with ReplayServer(feed="kraken-v2", rate=RATE) as server:
        config = expand("kraken-v2", {"url": server.url, "symbols": "BTC/USD,ETH/USD"})
        driver = Driver(GenericProtocol(config))
        task = await start(driver)
        try:
            await drop_and_resume(server, driver, before=60)
        finally:
            await stop(task)
    check_against_ledger(driver, server.ledger, kraken_ident, kraken_entry)
    assert reasons(driver) == ["connect", "reconnect"]  # marked, as the feed cannot replay
    assert driver.dropped > 0  # the snapshot's trades that had been delivered
    for symbol in ("BTC/USD", "ETH/USD"):  # ...and the ones missed came with it: no hole at all
        ids = [r.cursor for r in driver.data() if r.key == symbol]
        assert ids == list(range(ids[0], ids[-1] + 1))


async def test_kraken_refuses_an_unlisted_pair() -> None:
    async with ReplayServer(feed="kraken-v2", rate=RATE) as server:
        config = expand("kraken-v2", {"url": server.url, "symbols": "XXX/YYY"})
        driver = Driver(GenericProtocol(config))
        await driver.run(max_sockets=1)
    end = only_reconnect(driver)
    assert end.kind == "error" and '"success":false' in end.reason


# ---------------------------------------------------------------------------------- alpaca

ALPACA = {"key": "{{env:ALPACA_KEY}}", "secret": "{{secret:alpaca#secret}}", "symbols": "AAPL,MSFT"}
ALPACA_VALUES = {"env:ALPACA_KEY": "replay-key", "secret:alpaca#secret": "replay-secret"}


def alpaca_ident(record: Record) -> Ident:
    return record.data["S"], (record.data["i"] - 50_000) // 3


def alpaca_entry(entry: Entry) -> Ident:
    return entry.key, (entry.cursor - 50_000) // 3


async def test_alpaca_drop_is_marked() -> None:
    async with ReplayServer(feed="alpaca", rate=RATE) as server:
        config = expand("alpaca", {**ALPACA, "url": server.url})
        assert config["open"][1]["send"]["secret"] == "{{secret:alpaca#secret}}"  # kept a reference
        driver = Driver(GenericProtocol(config), values=ALPACA_VALUES)
        task = await start(driver)
        try:
            await drop_and_resume(server, driver)
        finally:
            await stop(task)
    check_against_ledger(driver, server.ledger, alpaca_ident, alpaca_entry)
    assert reasons(driver) == ["connect", "reconnect"]
    assert json.loads(driver.sent[0]) == {"action": "auth", "key": "replay-key", "secret": "replay-secret"}


async def test_alpaca_second_connection_is_a_limit_refusal() -> None:
    async with (
        ReplayServer(feed="alpaca", rate=RATE) as server,
        connect(f"{server.url}/iex") as holder,  # the account's one connection
    ):
        await holder.recv()
        await holder.send(json.dumps({"action": "auth", "key": "replay-key", "secret": "replay-secret"}))
        assert "authenticated" in str(await holder.recv())
        driver = Driver(
            GenericProtocol(expand("alpaca", {**ALPACA, "url": server.url})), values=ALPACA_VALUES
        )
        await driver.run(max_sockets=1)
    end = only_reconnect(driver)
    assert end.kind == "limit" and "connection limit exceeded" in end.reason


async def test_alpaca_wrong_secret_is_an_auth_refusal() -> None:
    async with ReplayServer(feed="alpaca", rate=RATE) as server:
        values = {**ALPACA_VALUES, "secret:alpaca#secret": "wrong"}
        driver = Driver(GenericProtocol(expand("alpaca", {**ALPACA, "url": server.url})), values=values)
        await driver.run(max_sockets=1)
    end = only_reconnect(driver)
    assert end.kind == "auth"
    assert "wrong" not in end.reason


# -------------------------------------------------------------------------- home assistant


def ha_ident(record: Record) -> Ident:
    return None, event_number(record.data)


def ha_entry(entry: Entry) -> Ident:
    return None, entry.cursor


async def test_home_assistant_drop_is_marked_and_ids_increase() -> None:
    async with ReplayServer(feed="home-assistant", rate=RATE) as server:
        config = expand("home-assistant", {"url": server.url, "token": "{{env:HA_TOKEN}}"})
        driver = Driver(GenericProtocol(config), values={"env:HA_TOKEN": "replay-token"})
        task = await start(driver)
        try:
            await drop_and_resume(server, driver)
        finally:
            await stop(task)
    check_against_ledger(driver, server.ledger, ha_ident, ha_entry)
    assert reasons(driver) == ["connect", "reconnect"]
    assert driver.data()[0].data["event_type"] == "state_changed"  # the record is the event
    subscribes = [json.loads(f) for f in driver.sent if "subscribe_events" in str(f)]
    assert [s["id"] for s in subscribes] == [2, 2]  # {{msg_id}}: a number per socket (auth took 1)


async def test_home_assistant_invalid_token_is_an_auth_refusal() -> None:
    async with ReplayServer(feed="home-assistant", rate=RATE) as server:
        config = expand("home-assistant", {"url": server.url, "token": "{{env:HA_TOKEN}}"})
        driver = Driver(GenericProtocol(config), values={"env:HA_TOKEN": "not-the-token"})
        await driver.run(max_sockets=1)
    end = only_reconnect(driver)
    assert end.kind == "auth"


@pytest.mark.parametrize(
    "feed", ["jetstream", "coinbase-exchange", "binance-spot", "kraken-v2", "alpaca", "home-assistant"]
)
async def test_replays_bind_to_loopback_only(feed: str) -> None:
    async with ReplayServer(feed=feed) as server:
        assert server.url.startswith("ws://127.0.0.1:")
