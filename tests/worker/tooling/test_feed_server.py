"""The local `seqfeed/1` upstream, exercised with a real websockets client over loopback."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from leaseworker.protocol import (
    MAX_FRAME_BYTES,
    STALE_EPOCH,
    DataFrame,
    ErrorFrame,
    ProtocolError,
    ReplayedFrame,
    SeqfeedProtocol,
)
from leaseworker_dev.feed import FAULT_AFTER, FeedServer, data_for

# Generous bounds: these tests check behaviour, not the scheduler's punctuality.
TIMEOUT = 5.0


@pytest.fixture
async def feed(tmp_path: Path) -> AsyncIterator[FeedServer]:
    async with FeedServer(rate=50.0, session_log=tmp_path / "sessions.jsonl") as server:
        yield server


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def subscribe(
    url: str, connection_id: str, *, after_seq: int = -1, epoch: int = 1, worker_id: str = "w1"
) -> ClientConnection:
    # max_queue=None: a test client that leaves frames unread must still see the server's close
    # frame promptly (a paused reader would wait out the close timeout on every close()).
    ws = await connect(url, max_size=None, max_queue=None, compression=None)
    for frame in SeqfeedProtocol().opening_frames(
        connection_id=connection_id, after_seq=after_seq, epoch=epoch, worker_id=worker_id
    ):
        await ws.send(frame)
    return ws


async def read_frames(ws: ClientConnection, count: int) -> list[str | bytes]:
    async with asyncio.timeout(TIMEOUT):
        return [await ws.recv() for _ in range(count)]


async def wait_for(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(TIMEOUT):
        while not predicate():  # noqa: ASYNC110  # the log file is written by another component
            await asyncio.sleep(0.01)


async def test_url_for(feed: FeedServer) -> None:
    assert feed.url == f"ws://127.0.0.1:{feed.port}"
    assert feed.url_for("c1") == f"ws://127.0.0.1:{feed.port}/feeds/c1"
    assert feed.url_for("a:b", rate=5, mode="gap") == f"ws://127.0.0.1:{feed.port}/feeds/a:b?rate=5&mode=gap"


async def test_replays_from_after_seq_contiguously_and_deterministically(feed: FeedServer) -> None:
    url = feed.url_for("replay", rate=1000)
    ws = await subscribe(url, "replay")
    decoder = SeqfeedProtocol().decoder(-1)
    for frame in await read_frames(ws, 200):
        decoded = decoder.decode(frame)  # raises on any gap or malformed frame
        assert isinstance(decoded, DataFrame)
        assert decoded.data == data_for("replay", decoded.seq)
    assert decoder.last_seq == 199
    await ws.close()

    # A second subscriber resuming after 149 gets exactly the same data from 150 on.
    ws = await subscribe(url, "replay", after_seq=149)
    decoder = SeqfeedProtocol().decoder(149)
    first = decoder.decode((await read_frames(ws, 1))[0])
    assert first == DataFrame(150, {"n": 150, "connection_id": "replay"})
    await ws.close()


async def test_replay_of_the_existing_head_is_immediate(tmp_path: Path) -> None:
    async with FeedServer(rate=200.0) as server:
        first = await subscribe(server.url_for("burst"), "burst")
        await read_frames(first, 1)
        await asyncio.sleep(1.0)  # the head is now ~200
        await first.close()
        started = time.monotonic()
        ws = await subscribe(server.url_for("burst"), "burst")
        await read_frames(ws, 150)
        # Replaying 150 existing messages must not be paced at 200/s (0.75 s).
        assert time.monotonic() - started < 0.5
        await ws.close()


async def test_live_pacing_roughly_matches_the_rate(feed: FeedServer) -> None:
    ws = await subscribe(feed.url_for("paced", rate=40), "paced")
    await read_frames(ws, 1)
    started = time.monotonic()
    frames = await read_frames(ws, 40)
    elapsed = time.monotonic() - started
    assert 0.5 < elapsed < 3.0, elapsed
    assert [json.loads(f)["seq"] for f in frames] == list(range(1, 41))
    await ws.close()


async def test_a_quiet_stream_sends_nothing(feed: FeedServer) -> None:
    ws = await subscribe(feed.url_for("quiet", rate=0), "quiet")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await ws.recv()
    await ws.close()


async def test_streams_are_independent_per_connection_id(feed: FeedServer) -> None:
    a = await subscribe(feed.url_for("a", rate=500), "a")
    b = await subscribe(feed.url_for("b", rate=500), "b")
    fa, fb = await read_frames(a, 5), await read_frames(b, 5)
    assert [json.loads(f)["data"] for f in fa] == [data_for("a", n) for n in range(5)]
    assert [json.loads(f)["data"] for f in fb] == [data_for("b", n) for n in range(5)]
    await a.close()
    await b.close()


async def test_stale_epoch_is_rejected_and_equal_epoch_accepted(feed: FeedServer, tmp_path: Path) -> None:
    url = feed.url_for("fenced", rate=200)
    owner = await subscribe(url, "fenced", epoch=5, worker_id="new-owner")
    await read_frames(owner, 1)
    assert feed.highest_epoch("fenced") == 5

    stale = await subscribe(url, "fenced", epoch=4, worker_id="zombie")
    decoded = SeqfeedProtocol().decoder(-1).decode((await read_frames(stale, 1))[0])
    assert isinstance(decoded, ErrorFrame)
    assert decoded.code == STALE_EPOCH
    with pytest.raises(ConnectionClosed):
        await read_frames(stale, 1)
    assert stale.close_code == 1008

    same = await subscribe(url, "fenced", epoch=5, worker_id="new-owner")
    assert isinstance(SeqfeedProtocol().decoder(-1).decode((await read_frames(same, 1))[0]), DataFrame)
    # Not kicked by default: the first session of epoch 5 still receives data.
    await read_frames(owner, 3)
    await owner.close()
    await same.close()

    await wait_for(lambda: sum(e["event"] == "close" for e in read_log(tmp_path / "sessions.jsonl")) == 3)
    rejects = [e for e in read_log(tmp_path / "sessions.jsonl") if e["event"] == "reject"]
    assert len(rejects) == 1
    assert rejects[0]["code"] == STALE_EPOCH
    assert rejects[0]["epoch"] == 4
    assert rejects[0]["worker_id"] == "zombie"


async def test_a_lower_epoch_session_is_not_kicked_by_default(feed: FeedServer) -> None:
    url = feed.url_for("overlap", rate=200)
    old = await subscribe(url, "overlap", epoch=1, worker_id="old")
    new = await subscribe(url, "overlap", epoch=2, worker_id="new")
    await read_frames(new, 1)
    # The old owner keeps receiving: catching a worker that delivers after losing its lease
    # is the job of the tests, and a kicking upstream would hide it.
    assert all(
        isinstance(SeqfeedProtocol().decoder(-1).decode(f), DataFrame) for f in await read_frames(old, 1)
    )
    more = await read_frames(old, 20)
    assert all(json.loads(f)["type"] == "data" for f in more)
    await old.close()
    await new.close()


async def test_kick_stale_closes_the_lower_epoch_session() -> None:
    async with FeedServer(rate=200, kick_stale=True) as server:
        url = server.url_for("kicked")
        old = await subscribe(url, "kicked", epoch=1)
        await read_frames(old, 1)
        new = await subscribe(url, "kicked", epoch=2)
        await read_frames(new, 1)
        frames = await collect(old, limit=10_000)
        assert json.loads(frames[-1])["code"] == STALE_EPOCH
        assert old.close_code == 1008
        await new.close()


async def test_session_log_records_open_subscribe_and_close(feed: FeedServer, tmp_path: Path) -> None:
    log_path = tmp_path / "sessions.jsonl"
    ws = await subscribe(feed.url_for("logged", rate=500), "logged", after_seq=9, epoch=3, worker_id="wA")
    frames = await read_frames(ws, 10)
    await ws.close()
    await wait_for(lambda: log_path.exists() and "close" in log_path.read_text())
    events = read_log(log_path)
    assert [e["event"] for e in events] == ["open", "subscribe", "close"]
    keys = {"t_ms", "event", "session", "connection_id", "epoch", "worker_id", "after_seq", "last_sent_seq"}
    assert all(keys | {"code", "reason"} <= e.keys() for e in events)
    assert len({e["session"] for e in events}) == 1
    subscribe_event, close_event = events[1], events[2]
    assert subscribe_event["connection_id"] == "logged"
    assert subscribe_event["epoch"] == 3
    assert subscribe_event["worker_id"] == "wA"
    assert subscribe_event["after_seq"] == 9
    assert abs(subscribe_event["t_ms"] - time.time() * 1000) < 10_000
    assert close_event["code"] == 1000
    assert close_event["last_sent_seq"] >= json.loads(frames[-1])["seq"] == 19
    assert events[0]["t_ms"] <= subscribe_event["t_ms"] <= close_event["t_ms"]


async def test_session_log_records_abnormal_close(feed: FeedServer, tmp_path: Path) -> None:
    log_path = tmp_path / "sessions.jsonl"
    ws = await subscribe(feed.url_for("dropped", rate=500), "dropped")
    await read_frames(ws, 3)
    ws.transport.abort()  # TCP reset, no close handshake: what a SIGKILLed worker looks like
    await wait_for(lambda: log_path.exists() and "close" in log_path.read_text())
    close_event = read_log(log_path)[-1]
    assert close_event["event"] == "close"
    assert close_event["code"] == 1006
    assert close_event["last_sent_seq"] >= 2


async def test_stop_closes_sessions_with_1001_and_logs_them(tmp_path: Path) -> None:
    log_path = tmp_path / "stop.jsonl"
    server = FeedServer(rate=100, session_log=log_path)
    await server.start()
    ws = await subscribe(server.url_for("stopping"), "stopping")
    await read_frames(ws, 1)
    await server.stop()
    with pytest.raises(ConnectionClosed):
        async with asyncio.timeout(TIMEOUT):
            while True:
                await ws.recv()
    assert ws.close_code == 1001
    assert [e["event"] for e in read_log(log_path)] == ["open", "subscribe", "close"]


@pytest.mark.parametrize(
    ("first_frame", "path"),
    [
        ("not json", "/feeds/x"),
        ('{"type":"data","seq":0}', "/feeds/x"),
        ('{"type":"subscribe","connection_id":"x","after_seq":"1","epoch":1,"worker_id":"w"}', "/feeds/x"),
        ('{"type":"subscribe","connection_id":"x","after_seq":-2,"epoch":1,"worker_id":"w"}', "/feeds/x"),
        ('{"type":"subscribe","connection_id":"x","after_seq":1,"epoch":true,"worker_id":"w"}', "/feeds/x"),
        ('{"type":"subscribe","connection_id":"x","after_seq":1,"epoch":1}', "/feeds/x"),
        (
            '{"type":"subscribe","connection_id":"bad id!","after_seq":1,"epoch":1,"worker_id":"w"}',
            "/feeds/x",
        ),
        ('{"type":"subscribe","connection_id":"y","after_seq":1,"epoch":1,"worker_id":"w"}', "/feeds/x"),
        (
            '{"type":"subscribe","connection_id":"x","after_seq":1,"epoch":1,"worker_id":"w"}',
            "/feeds/x?mode=nope",
        ),
        (
            '{"type":"subscribe","connection_id":"x","after_seq":1,"epoch":1,"worker_id":"w"}',
            "/feeds/x?rate=fast",
        ),
        (
            '{"type":"subscribe","connection_id":"x","after_seq":1,"epoch":1,"worker_id":"w"}',
            "/feeds/x?rate=-1",
        ),
    ],
)
async def test_malformed_subscribe_gets_bad_request(feed: FeedServer, first_frame: str, path: str) -> None:
    ws = await connect(feed.url + path)
    await ws.send(first_frame)
    frames = await read_frames(ws, 1)
    decoded = SeqfeedProtocol().decoder(-1).decode(frames[0])
    assert isinstance(decoded, ErrorFrame)
    assert decoded.code == "bad_request"
    with pytest.raises(ConnectionClosed):
        await read_frames(ws, 1)
    assert ws.close_code == 1008


async def test_any_path_is_served_when_it_names_no_id(feed: FeedServer) -> None:
    ws = await subscribe(feed.url + "/", "pathless")
    assert json.loads((await read_frames(ws, 1))[0])["data"] == data_for("pathless", 0)
    await ws.close()


# -- fault modes ------------------------------------------------------------------------------


async def collect(ws: ClientConnection, limit: int = 50) -> list[str | bytes]:
    """Frames until the server closes, goes quiet for a moment, or `limit` is reached."""
    frames: list[str | bytes] = []
    try:
        while len(frames) < limit:
            async with asyncio.timeout(0.5):
                frames.append(await ws.recv())
    except (ConnectionClosed, TimeoutError):
        pass
    return frames


def decode_all(
    frames: list[str | bytes],
) -> tuple[list[DataFrame | ReplayedFrame | ErrorFrame], ProtocolError | None]:
    decoder = SeqfeedProtocol().decoder(-1)
    out: list[DataFrame | ReplayedFrame | ErrorFrame] = []
    for frame in frames:
        try:
            out.append(decoder.decode(frame))
        except ProtocolError as exc:
            return out, exc
    return out, None


@pytest.mark.parametrize("mode", ["garbage", "gap", "oversized"])
async def test_fault_after_a_few_valid_frames(feed: FeedServer, mode: str) -> None:
    ws = await subscribe(feed.url_for(f"fault-{mode}", rate=500, mode=mode), f"fault-{mode}")
    frames = await collect(ws, limit=FAULT_AFTER + 5)
    decoded, error = decode_all(frames)
    assert [d.seq for d in decoded if isinstance(d, DataFrame)] == list(range(FAULT_AFTER))
    assert error is not None
    assert error.kind == {"garbage": "bad_json", "gap": "gap", "oversized": "oversized"}[mode]
    if mode == "oversized":
        assert len(frames[FAULT_AFTER]) > MAX_FRAME_BYTES
    if mode == "gap":
        # The stream carries on after the skipped seq.
        seqs = [json.loads(f)["seq"] for f in frames]
        assert seqs[: FAULT_AFTER + 2] == [0, 1, 2, 4, 5]
    await ws.close()


async def test_fault_close_right_after_subscribe(feed: FeedServer) -> None:
    ws = await subscribe(feed.url_for("fault-close", rate=500, mode="close"), "fault-close")
    assert await collect(ws) == []
    assert ws.close_code == 1011


async def test_fault_error_frame_then_close(feed: FeedServer) -> None:
    ws = await subscribe(feed.url_for("fault-error", mode="error"), "fault-error")
    frames = await collect(ws)
    decoded, error = decode_all(frames)
    assert error is None
    assert decoded == [ErrorFrame("unavailable", "fault: upstream unavailable")]
    assert ws.close_code == 1013


# -- the command ------------------------------------------------------------------------------


def test_module_prints_its_url_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    log_path = tmp_path / "cli.jsonl"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "leaseworker_dev.feed",
            "--port",
            "0",
            "--rate",
            "100",
            "--session-log",
            str(log_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        url = json.loads(line)["feed"]
        assert url.startswith("ws://127.0.0.1:")
        assert not url.endswith(":0")

        async def one_session() -> None:
            ws = await subscribe(url + "/feeds/cli", "cli")
            await read_frames(ws, 3)
            # Left open on purpose: SIGTERM must close and log it.

        asyncio.run(one_session())
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=TIMEOUT) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert [e["event"] for e in read_log(log_path)] == ["open", "subscribe", "close"]
