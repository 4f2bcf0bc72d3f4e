"""The adapter over real WebSockets, against the spec-built firehose replay (replay_server.py).

`Session` stands in for the worker's session loop as the adapter's contract describes it: open
the socket `connect_request()` describes, feed frames to the adapter, perform its actions, and on
a `Reconnect` open the next socket from the last checkpoint an `Emit` carried.
"""

from __future__ import annotations

import asyncio
import base64
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from leaseworker_atproto.replay_server import FirehoseReplayServer, big_commit_body
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from leaseworker.protocol.adapter import (
    Action,
    Dropped,
    Emit,
    Fail,
    Gap,
    OpenReason,
    Ready,
    Reconnect,
    Resume,
    SocketContext,
)
from leaseworker.protocol.registry import ProtocolSpec, build

ONE_MIB = 1024 * 1024


@dataclass
class Session:
    url: str
    config: dict[str, Any] = field(default_factory=dict)
    actions: list[Action] = field(default_factory=list)
    sockets: int = 0
    checkpoint: Any = None
    at_ms: int | None = None

    def delivered(self) -> list[int]:
        return [a.cursor for a in self.actions if isinstance(a, Emit) and a.kind == "data"]

    def of(self, kind: type[Action]) -> list[Action]:
        return [action for action in self.actions if isinstance(action, kind)]

    async def socket(
        self, reason: OpenReason, until: Callable[[Any], bool] | None, timeout: float = 20.0
    ) -> Action | None:
        """One socket, to its end: the ending action (Reconnect/Fail), or None once `until`
        holds for the checkpoint (checked on every frame and every 0.1 s)."""
        protocol = build(ProtocolSpec(name="atproto-firehose/1", ws_url=self.url, config=self.config))
        resume = Resume(cursor=self.checkpoint, at_ms=self.at_ms, reason=reason)
        adapter = protocol.adapter(SocketContext("c1", 1, "w1", resume), time.monotonic())
        request = adapter.connect_request()
        self.sockets += 1
        async with connect(
            request.url,
            max_size=request.max_frame_bytes,
            compression="deflate" if request.compression else None,
            open_timeout=5,
        ) as ws:
            self._perform(adapter.on_open(time.monotonic(), _wall()))
            deadline = time.monotonic() + timeout
            while True:
                if until is not None and until(self.checkpoint):
                    return None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no end after {timeout} s, at checkpoint {self.checkpoint}")
                try:
                    frame = await asyncio.wait_for(ws.recv(), 0.1)  # cancelling recv() loses nothing
                except TimeoutError:
                    continue
                except ConnectionClosed as closed:
                    code, why = (closed.rcvd.code, closed.rcvd.reason) if closed.rcvd else (None, "")
                    return self._perform(adapter.on_close(code, why, _wall()))
                end = self._perform(adapter.on_frame(frame, time.monotonic(), _wall()))
                if end is not None:
                    return end

    def _perform(self, actions: Any) -> Action | None:
        for action in actions:
            self.actions.append(action)
            if isinstance(action, Emit):
                self.checkpoint, self.at_ms = action.checkpoint, _wall()
            if isinstance(action, Reconnect | Fail):
                return action
        return None


def _wall() -> int:
    return time.time_ns() // 1_000_000


def at(seq: int) -> Callable[[Any], bool]:
    return lambda checkpoint: bool(checkpoint == seq)


def _seqs_of(session: Session) -> list[int]:
    return session.delivered()


async def test_every_seq_arrives_with_the_big_frame() -> None:
    async with FirehoseReplayServer() as server:
        server.append_samples(120, seed=3)
        big = server.append("#commit", big_commit_body(server.head + 1, random.Random(5)), skip=2)
        server.append_samples(80, seed=4)
        assert len(big.frame) > ONE_MIB
        session = Session(server.url, {"start": "oldest"})
        assert await session.socket("connect", until=at(server.head)) is None
        assert _seqs_of(session) == server.seqs()
        assert session.of(Gap) == []
        assert session.of(Ready) == [Ready()]
        [record] = [a for a in session.of(Emit) if isinstance(a, Emit) and a.cursor == big.seq]
        assert isinstance(record, Emit)
        assert record.data["t"] == "#commit"
        assert len(base64.b64decode(record.data["blocks"]["$bytes"])) == 1_000_000
        assert len(record.data["ops"]) == 200
        assert record.data["commit"]["$link"].startswith("bafyrei")


async def test_the_default_1_mib_limit_would_not_take_the_big_frame() -> None:
    async with FirehoseReplayServer() as server:
        server.append("#commit", big_commit_body(1, random.Random(5)))
        async with connect(server.url + "?cursor=0", max_size=ONE_MIB) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
        assert closed.value.sent is not None
        assert closed.value.sent.code == 1009  # message too big


@pytest.mark.parametrize("inclusive", [False, True], ids=["seq>cursor (PDS)", "seq>=cursor (spec text)"])
async def test_resuming_loses_and_duplicates_nothing(inclusive: bool) -> None:
    async with FirehoseReplayServer(inclusive_cursor=inclusive) as server:
        server.append_samples(150, seed=6)
        big = server.append("#commit", big_commit_body(server.head + 1, random.Random(7)), skip=5)
        server.disconnect_after = 23  # every socket ends after 23 frames: resume, again and again
        session = Session(server.url, {"start": "oldest"})
        rng = random.Random(8)

        async def live() -> None:  # new events while the client comes and goes
            for _ in range(60):
                await asyncio.sleep(0.005)
                server.append_samples(1, seed=rng.randrange(1000), max_skip=4)

        writer = asyncio.create_task(live())
        reason: OpenReason = "connect"
        for _ in range(100):
            end = await session.socket(reason, until=lambda at: writer.done() and at == server.head)
            if end is None:
                break
            assert isinstance(end, Reconnect)
            assert end.kind == "closed"
            reason = "reconnect"
        await writer
        delivered = _seqs_of(session)
        assert delivered == server.seqs()  # each seq once, in order, the big one included
        assert big.seq in delivered
        assert session.sockets >= len(delivered) // server.disconnect_after > 5
        assert session.of(Gap) == []
        assert all(cursor is not None for cursor in delivered)
        replays = session.of(Dropped)
        if inclusive:  # each resumed socket repeats the checkpoint's event first: dropped, counted
            assert len(replays) == session.sockets - 1
        else:
            assert replays == []
        used = [log.cursor for log in server.connections]
        assert used[0] == 0
        assert all(cursor is not None and cursor > 0 for cursor in used[1:])


async def test_a_cursor_older_than_the_window_is_a_gap_then_the_window() -> None:
    async with FirehoseReplayServer(retention=50) as server:
        server.append_samples(200, seed=9)
        session = Session(server.url)
        session.checkpoint = 17  # long gone from the window
        assert await session.socket("takeover", until=at(server.head)) is None
        [gap] = session.of(Gap)
        assert isinstance(gap, Gap)
        assert gap.reason == "cursor_too_old"
        assert gap.from_cursor == 17
        first_record = next(i for i, a in enumerate(session.actions) if isinstance(a, Emit))
        assert session.actions.index(gap) < first_record
        assert _seqs_of(session) == server.seqs()
        assert len(server.seqs()) == 50
        assert server.connections[-1].answer == "outdated"


async def test_a_cursor_in_the_future_fails_the_connection() -> None:
    async with FirehoseReplayServer() as server:
        server.append_samples(10, seed=10)
        session = Session(server.url)
        session.checkpoint = server.head + 1000
        end = await session.socket("takeover", until=None)
        assert isinstance(end, Fail)
        assert "FutureCursor" in end.reason
        assert _seqs_of(session) == []


async def test_too_slow_reconnects_and_the_resume_catches_up() -> None:
    async with FirehoseReplayServer(max_backlog=5) as server:
        server.append_samples(5, seed=11)
        session = Session(server.url, {"start": "oldest"})
        first = asyncio.create_task(session.socket("connect", until=None))
        await server.wait_subscribed()
        server.append_samples(30, seed=12)  # 30 at once: more than the outbox holds
        end = await first
        assert isinstance(end, Reconnect)
        assert end.kind == "error"
        assert end.reason.startswith("ConsumerTooSlow")
        assert await session.socket("reconnect", until=at(server.head)) is None
        assert _seqs_of(session) == server.seqs()


async def test_a_live_start_marks_where_it_starts() -> None:
    async with FirehoseReplayServer() as server:
        server.append_samples(20, seed=13)
        before = server.head
        session = Session(server.url)
        task = asyncio.create_task(session.socket("connect", until=None, timeout=5))
        await server.wait_subscribed()
        added = server.append_samples(5, seed=14)
        server.kick("InternalError", "going away")
        end = await task
        assert isinstance(end, Reconnect)
        assert isinstance(session.actions[0], Gap)
        assert session.actions[0].reason == "connect"
        assert _seqs_of(session) == [event.seq for event in added]
        assert all(seq > before for seq in _seqs_of(session))
