"""The real ConnectionSession speaking generic/1 (and seqfeed/1's stale epoch) to local upstreams.

The feeds are the replays of real feeds (dev_src/leaseworker_dev/feed/replays) or small scripted
servers; the lease is a local object, the references come from a dict, and the sink records
what it accepted. What is checked is what a consumer and the upstream see: records, gap
markers, seq numbering, the checkpoint cursor, and how the session ends.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve

from leaseworker.lease.model import HAND_BACK_REASONS, UPSTREAM_STALE_EPOCH, Lease
from leaseworker.lease.vocabulary import MAX_CURSOR_BYTES
from leaseworker.observability.metrics import WorkerMetrics
from leaseworker.observability.tracing import configure_tracing
from leaseworker.protocol.presets import expand
from leaseworker.records import SinkRecord
from leaseworker.settings import Settings
from leaseworker.worker import connect_budget, socket_actions
from leaseworker.worker import failures as failures_module
from leaseworker.worker.endings import Outcome, SessionResult
from leaseworker.worker.references import NoReferences, References
from leaseworker.worker.rotation import open_successor
from leaseworker.worker.session import ConnectionSession
from leaseworker.worker.session_deps import SessionDeps
from leaseworker_dev.feed.replays.base import ReplayServer
from tests.worker.integration.test_session import RecordingSink

RATE = 40.0


class Values:
    """References from a dict, counting invalidations (a rotated secret is read again)."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values
        self.invalidated = 0

    async def resolve(self, refs: Any) -> dict[str, str]:
        return {ref: self.values[ref] for ref in refs}

    def invalidate(self, refs: Any) -> None:
        self.invalidated += 1


class Run:
    def __init__(
        self,
        config: dict[str, Any] | None,
        *,
        values: dict[str, str] | None = None,
        url: str = "",
        references: References | None = None,
    ) -> None:
        self.failures: list[str] = []
        self.sink = RecordingSink()
        self.values = Values(values or {})
        self.lease = Lease(
            connection_id="c-1",
            epoch=3,
            owner="w-1",
            ws_url=url or (config or {}).get("connect", {}).get("url", ""),
            start_seq=-1,
            valid_until=time.monotonic() + 3600,
            protocol="generic/1" if config is not None else "seqfeed/1",
            protocol_config=json.dumps(config) if config is not None else None,
        )
        deps = SessionDeps(
            settings=Settings(worker_id="w-1"),
            sink=self.sink,
            metrics=WorkerMetrics(namespace="test", stream=io.StringIO()),
            tracing=configure_tracing(None),
            references=references or self.values,
        )
        self.session = ConnectionSession(self.lease, deps, self._record_failure)
        self.task: asyncio.Task[SessionResult] = asyncio.create_task(self.session.run())

    async def _record_failure(self, lease: Lease, reason: str) -> bool:
        self.failures.append(reason)
        return True

    @property
    def records(self) -> list[SinkRecord]:
        return [record for batch in self.sink.batches for record in batch]

    async def until(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.task.done():
                pytest.fail(f"session ended before {what}: {self.task.result()}")
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}")
            await asyncio.sleep(0.02)

    async def stop(self) -> SessionResult:
        self.session.request_release("test over")
        return await asyncio.wait_for(self.task, 10)


@pytest.fixture(autouse=True)
def record_every_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failures_module, "FAILURE_RECORD_INTERVAL_SECONDS", 0.0)


def contiguous_from_zero(records: list[SinkRecord]) -> None:
    assert [r.seq for r in records] == list(range(len(records))), "seq must count 0, 1, 2, … in an epoch"
    assert {r.epoch for r in records} == {3}


async def test_jetstream_resumes_from_its_cursor_losing_nothing_and_marking_nothing() -> None:
    async with ReplayServer(feed="jetstream", rate=RATE) as server:
        run = Run(expand("jetstream", {"url": server.url}))
        await run.until(lambda: len(run.records) >= 20, 10, "20 records")
        await server.drop()
        await run.until(
            lambda: len(server.ledger.connections()) >= 2 and len(run.records) >= 60, 15, "a resume"
        )
        await run.stop()
    records = run.records
    contiguous_from_zero(records)
    assert all(r.kind == "data" for r in records), "a replayable feed needs no gap marker"
    delivered = [r.cursor for r in records]
    assert delivered == sorted(set(delivered)), "each event once, in order: the overlap was dropped by cursor"
    sent = {e.cursor for e in server.ledger.data() if e.cursor <= delivered[-1]}
    assert sent <= set(delivered), f"lost across the resume: {sorted(sent - set(delivered))[:5]}"
    assert json.loads(run.session.delivered_cursor or "null") == delivered[-1]  # the checkpoint cursor


def data_after_reconnect(records: list[SinkRecord]) -> bool:
    reasons = [r.data.get("reason") if r.kind == "gap" else None for r in records]
    return "reconnect" in reasons and any(r.kind == "data" for r in records[reasons.index("reconnect") + 1 :])


async def test_coinbase_marks_a_dropped_socket_and_an_upstream_loss_before_the_next_record() -> None:
    async with ReplayServer(feed="coinbase-exchange", rate=RATE) as server:
        run = Run(expand("coinbase-exchange", {"url": server.url, "product_ids": "BTC-USD,ETH-USD"}))
        await run.until(lambda: sum(r.kind == "data" for r in run.records) >= 20, 10, "20 trades")
        server.skip(3)  # the upstream itself loses three trades inside one socket
        await run.until(
            lambda: any(r.data.get("reason") == "seq_gap" for r in run.records if r.kind == "gap"),
            10,
            "a seq_gap",
        )
        await server.drop()
        await run.until(lambda: len(server.ledger.connections()) >= 2, 10, "a reconnect")
        # The skipped trades may span both products (two seq_gap markers), so count nothing:
        # wait for the new socket's marker and a record after it.
        await run.until(lambda: data_after_reconnect(run.records), 10, "data after the reconnect")
        await run.stop()
    records = run.records
    contiguous_from_zero(records)
    reasons = [r.data["reason"] for r in records if r.kind == "gap"]
    assert reasons[0] == "connect" and records[0].kind == "gap", (
        "the first socket of a new connection is marked"
    )
    assert "seq_gap" in reasons and "reconnect" in reasons
    # Every trade id missing for a product lies between a marker's bounds, placed between the
    # records around the hole.
    for product in ("BTC-USD", "ETH-USD"):
        placed = [(i, r.cursor) for i, r in enumerate(records) if r.kind == "data" and r.key == product]
        for (i, before), (j, after) in itertools.pairwise(placed):
            if after != before + 1:
                between = [r for r in records[i + 1 : j] if r.kind == "gap"]
                assert between, f"{product}: trades {before + 1}..{after - 1} lost with no marker"
    first_after_drop = next(r for r in records if r.kind == "gap" and r.data["reason"] == "reconnect")
    assert (
        first_after_drop.data["since_ms"] is not None
        and first_after_drop.data["until_ms"] >= first_after_drop.data["since_ms"]
    )


async def test_rotation_subscribes_the_successor_before_closing_the_old_socket() -> None:
    async with ReplayServer(feed="jetstream", rate=RATE) as server:
        config = expand("jetstream", {"url": server.url})
        config["lifetime"] = {"max_age_s": 1.0}
        run = Run(config)
        await run.until(
            lambda: len(server.ledger.connections()) >= 3 and len(run.records) >= 80, 15, "two rotations"
        )
        await run.stop()
        ledger = server.ledger
    opens = {e.conn: e.t_ms for e in ledger.of_kind("open")}
    closes = {e.conn: e.t_ms for e in ledger.of_kind("close")}
    assert opens[2] <= closes[1], "make before break: the successor opened before the old socket closed"
    records = run.records
    contiguous_from_zero(records)
    delivered = [r.cursor for r in records]
    assert delivered == sorted(set(delivered)), "no record twice across a rotation"
    assert {e.cursor for e in ledger.data() if e.cursor <= delivered[-1]} <= set(delivered)
    assert all(r.kind == "data" for r in records)


async def test_a_rotation_whose_budget_token_lapsed_sends_no_upgrade_and_keeps_the_old_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rotation's successor is opened under its token's send-by time, like any connect: one
    past it never reaches the upstream (worker/upstream.py TokenLapsed), and the old socket
    carries on delivering (a rotation is tried once per socket; the upstream's own cut, if it
    comes, is an ordinary reconnect)."""
    tokens: list[bool] = []

    async def lapsed_for_rotations(_: ConnectionSession, limit: Any, *, rotation: bool = False) -> float:
        tokens.append(rotation)
        return time.monotonic() - 0.01 if rotation else math.inf

    monkeypatch.setattr(connect_budget, "wait_for_token", lapsed_for_rotations)
    async with ReplayServer(feed="jetstream", rate=RATE) as server:
        config = expand("jetstream", {"url": server.url})
        config["lifetime"] = {"max_age_s": 0.3}
        run = Run(config)
        await run.until(lambda: True in tokens, 10, "a rotation")
        after = len(run.records)
        await run.until(lambda: len(run.records) >= after + 20, 10, "records on the old socket")
        await run.stop()
        ledger = server.ledger
    assert len(ledger.connections()) == 1, "a successor's upgrade was sent after its token lapsed"
    contiguous_from_zero(run.records)


async def test_a_stop_asked_for_while_the_successor_opens_closes_both_sockets_and_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stop arrives after the successor opened but before the switch: the closer has already
    closed the old socket, so the successor must be closed too, or the session never ends."""
    runs: list[Run] = []

    async def stop_as_it_opens(session: ConnectionSession, new_adapter: Any, **kwargs: Any) -> Any:
        successor = await open_successor(session, new_adapter, **kwargs)
        runs[0].session.request_release("stopped while the successor opened")
        await asyncio.sleep(0.05)  # the closer runs now, before the switch
        return successor

    monkeypatch.setattr(socket_actions, "open_successor", stop_as_it_opens)
    async with ReplayServer(feed="jetstream", rate=RATE) as server:
        config = expand("jetstream", {"url": server.url})
        config["lifetime"] = {"max_age_s": 0.5}
        runs.append(Run(config))
        result = await asyncio.wait_for(runs[0].task, 10)
        await asyncio.sleep(0.2)
        ledger = server.ledger
    assert result.outcome is Outcome.RELEASE, result
    opened = {e.conn for e in ledger.of_kind("open")}
    closed = {e.conn for e in ledger.of_kind("close")}
    assert len(opened) == 2 and opened <= closed, f"every socket closed: opened {opened}, closed {closed}"


ALPACA = {"key": "{{env:ALPACA_KEY}}", "secret": "{{secret:alpaca#secret}}", "symbols": "AAPL"}


async def test_an_auth_refusal_backs_off_and_fails_the_connection_after_repeated_refusals() -> None:
    async with ReplayServer(feed="alpaca", rate=RATE) as server:
        run = Run(
            expand("alpaca", {**ALPACA, "url": server.url}),
            values={"env:ALPACA_KEY": "replay-key", "secret:alpaca#secret": "wrong-secret-value"},
        )
        result = await asyncio.wait_for(run.task, 30)
    assert result.outcome is Outcome.FAILED, result
    assert "auth refused" in result.reason
    assert any(f.startswith("auth refused") for f in run.failures), run.failures
    assert run.values.invalidated >= 4, "the secret is read again after each refusal"
    assert not any("wrong-secret-value" in text for text in [*run.failures, result.reason])
    assert not run.records


async def test_a_connection_limit_refusal_backs_off_and_never_fails_the_connection() -> None:
    values = {"env:ALPACA_KEY": "replay-key", "secret:alpaca#secret": "replay-secret"}
    async with ReplayServer(feed="alpaca", rate=RATE) as server:
        config = expand("alpaca", {**ALPACA, "url": server.url})
        holder = Run(config, values=values)  # holds the account's only connection
        await holder.until(
            lambda: any(r.kind == "data" for r in holder.records), 10, "the first holder's data"
        )
        second = Run(config, values=values)
        await second.until(
            lambda: sum("406" in f or "limit" in f for f in second.failures) >= 6, 40, "six refusals"
        )
        assert not second.task.done(), "a connection-limit refusal must never fail the connection"
        await holder.stop()
        await second.until(
            lambda: any(r.kind == "data" for r in second.records), 30, "data once the limit frees"
        )
        await second.stop()


async def scripted_server(handler: Callable[[ServerConnection], Awaitable[None]]) -> AsyncIterator[str]:
    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        yield f"ws://127.0.0.1:{port}/feed"


@pytest.fixture
async def undecodable_feed() -> AsyncIterator[str]:
    async def handler(ws: ServerConnection) -> None:
        await ws.send('{"n": 1}')
        await ws.send("not json {")
        await ws.send(b"\xff\xfe binary")
        await ws.send('{"n": 2}')
        await ws.wait_closed()

    async for url in scripted_server(handler):
        yield url


async def test_an_undecodable_frame_is_delivered_raw_in_its_place(undecodable_feed: str) -> None:
    run = Run({"connect": {"url": undecodable_feed}, "frames": {"on_undecodable": "raw"}})
    await run.until(lambda: len(run.records) >= 4, 10, "four records")
    await run.stop()
    kinds = [r.kind for r in run.records]
    # A feed without a resumable cursor cannot replay: its first socket is marked, then every
    # frame is delivered in its place, the undecodable ones as they came.
    assert kinds == ["gap", "data", "raw", "raw", "data"], kinds
    assert run.records[2].data["encoding"] == "text" and run.records[3].data["encoding"] == "base64"
    contiguous_from_zero(run.records)


async def test_an_undecodable_frame_fails_the_connection_when_the_config_says_so(
    undecodable_feed: str,
) -> None:
    run = Run({"connect": {"url": undecodable_feed}, "frames": {"on_undecodable": "fail"}})
    result = await asyncio.wait_for(run.task, 10)
    assert result.outcome is Outcome.FAILED
    assert [r.kind for r in run.records] == ["gap", "data"]  # what came before was delivered


@pytest.fixture
async def long_cursor_feed() -> AsyncIterator[str]:
    async def handler(ws: ServerConnection) -> None:
        await ws.send(json.dumps({"id": "a" * 20}))
        await ws.send(json.dumps({"id": "b" * (MAX_CURSOR_BYTES + 10)}))
        await ws.wait_closed()

    async for url in scripted_server(handler):
        yield url


async def test_a_resumable_cursor_larger_than_a_checkpoint_holds_fails_with_the_reason(
    long_cursor_feed: str,
) -> None:
    config = {
        "connect": {"url": long_cursor_feed + "{{#cursor}}?after={{cursor}}{{/cursor}}"},
        "cursor": {"path": "/id", "order": "monotonic", "resume": {"in": "url"}},
    }
    run = Run(config)
    result = await asyncio.wait_for(run.task, 10)
    assert result.outcome is Outcome.FAILED
    assert f"exceeds the {MAX_CURSOR_BYTES}-byte limit" in result.reason
    assert len(run.records) == 1 and run.session.delivered_cursor == json.dumps("a" * 20)


@pytest.fixture
async def stale_epoch_feed() -> AsyncIterator[str]:
    async def handler(ws: ServerConnection) -> None:
        await ws.recv()
        await ws.send(json.dumps({"type": "data", "seq": 0, "data": {}}))
        await ws.send(json.dumps({"type": "error", "code": "stale_epoch", "message": "epoch 4 seen"}))
        await ws.wait_closed()

    async for url in scripted_server(handler):
        yield url


async def test_seqfeed_stale_epoch_releases_the_lease_instead_of_stranding_it(stale_epoch_feed: str) -> None:
    run = Run(None, url=stale_epoch_feed)
    result = await asyncio.wait_for(run.task, 10)
    # Lost, with the reason the settler hands back (conditionally): a session-held item is
    # never left naming our live session.
    assert (result.outcome, result.reason) == (Outcome.LOST, UPSTREAM_STALE_EPOCH)
    assert result.reason in HAND_BACK_REASONS


async def test_a_config_that_cannot_render_at_session_start_fails_the_connection_with_the_reason() -> None:
    """Valid at `add`, but its environment variable is not set on this worker."""
    headers = {"Authorization": "{{env:LW_TEST_UNSET_TOKEN}}"}
    run = Run({"connect": {"url": "ws://127.0.0.1:9/feed", "headers": headers}}, references=NoReferences())
    result = await asyncio.wait_for(run.task, 20)
    assert result.outcome is Outcome.FAILED
    assert "env:LW_TEST_UNSET_TOKEN" in result.reason, result.reason
    assert not run.records


SECRET_TOKEN = "tok-7c1d2e9f-never-shown"


@pytest.fixture
async def echoing_feed() -> AsyncIterator[str]:
    """An upstream that echoes what it was sent: first in an error frame, then in a close reason."""
    sockets = 0

    async def handler(ws: ServerConnection) -> None:
        nonlocal sockets
        sockets += 1
        sent = str(await ws.recv())
        if sockets % 2:
            await ws.send(json.dumps({"type": "error", "message": f"bad subscribe {sent}"}))
            await ws.wait_closed()
        else:
            await ws.close(1008, f"rejected {SECRET_TOKEN}")

    async for url in scripted_server(handler):
        yield url


async def test_a_resolved_value_an_upstream_echoes_never_reaches_errors_or_logs(
    echoing_feed: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = {
        "connect": {"url": echoing_feed},
        "open": [{"send": {"type": "subscribe", "token": "{{secret:feed#token}}"}}],
        "frames": {"classify": [{"when": {"/type": "error"}, "action": "error", "message": "/message"}]},
    }
    with caplog.at_level(logging.DEBUG, logger="leaseworker"):
        run = Run(config, values={"secret:feed#token": SECRET_TOKEN})
        await run.until(lambda: len(run.failures) >= 4, 30, "four failed sockets")
        result = await run.stop()
    assert any("bad subscribe" in f for f in run.failures), run.failures
    assert any("rejected" in f for f in run.failures), run.failures
    logged = json.dumps([vars(record) for record in caplog.records], default=str)  # extras included
    shown = [*run.failures, result.reason, logged]
    assert not any(SECRET_TOKEN in text for text in shown), [t for t in shown if SECRET_TOKEN in t][:1]
    assert any("***" in f for f in run.failures), "the echo is kept, the value replaced"
