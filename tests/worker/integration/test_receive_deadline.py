"""worker/receive_deadline.py on real websockets sockets over loopback: a receive ends at its
deadline, never early, never loses a frame, lets other cancellations through, and arms timers per
deadline move, not per frame."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve

from leaseworker.worker.receive_deadline import DEADLINE, ReceiveDeadline


@contextlib.asynccontextmanager
async def socket_pair() -> AsyncIterator[tuple[ServerConnection, ClientConnection]]:
    accepted: asyncio.Queue[ServerConnection] = asyncio.Queue()
    done = asyncio.Event()

    async def handler(connection: ServerConnection) -> None:
        await accepted.put(connection)
        await done.wait()

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}") as client:
            server_side = await accepted.get()
            try:
                yield server_side, client
            finally:
                done.set()


async def test_a_receive_with_no_frame_ends_at_its_deadline_not_before() -> None:
    async with socket_pair() as (_, client):
        receiving = ReceiveDeadline()
        started = time.monotonic()
        result = await receiving.receive(client, started + 0.2)
        elapsed = time.monotonic() - started
        receiving.close()
    assert result is DEADLINE
    assert 0.2 <= elapsed < 0.6


async def test_a_deadline_already_past_returns_at_once_and_a_frame_waits_for_the_next_receive() -> None:
    async with socket_pair() as (server, client):
        receiving = ReceiveDeadline()
        await server.send("one")
        await asyncio.sleep(0.05)
        assert await receiving.receive(client, time.monotonic() - 1) is DEADLINE
        assert await receiving.receive(client, math.inf) == "one"
        receiving.close()


async def test_a_later_deadline_is_kept_although_an_earlier_timer_was_armed() -> None:
    async with socket_pair() as (server, client):
        receiving = ReceiveDeadline()
        await server.send("first")
        assert await receiving.receive(client, time.monotonic() + 0.1) == "first"  # armed at +0.1
        started = time.monotonic()
        result = await receiving.receive(client, started + 0.4)  # the stale timer fires at +0.1
        elapsed = time.monotonic() - started
        receiving.close()
    assert result is DEADLINE
    assert elapsed >= 0.4


async def test_an_earlier_deadline_rearms_the_timer_at_once() -> None:
    async with socket_pair() as (server, client):
        receiving = ReceiveDeadline()
        await server.send("first")
        assert await receiving.receive(client, time.monotonic() + 30) == "first"  # armed at +30
        started = time.monotonic()
        result = await receiving.receive(client, started + 0.1)
        elapsed = time.monotonic() - started
        receiving.close()
    assert result is DEADLINE
    assert 0.1 <= elapsed < 1.0


async def test_no_frame_is_lost_when_deadlines_pass_between_frames() -> None:
    async with socket_pair() as (server, client):
        receiving = ReceiveDeadline()

        async def send() -> None:
            for n in range(200):
                await server.send(str(n))
                if n % 20 == 0:
                    await asyncio.sleep(0.012)  # several deadlines of 5 ms pass in the gaps

        sender = asyncio.create_task(send())
        received: list[str] = []
        deadlines = 0
        while len(received) < 200:
            result = await receiving.receive(client, time.monotonic() + 0.005)
            if result is DEADLINE:
                deadlines += 1
            else:
                assert isinstance(result, str)
                received.append(result)
        await sender
        receiving.close()
    assert received == [str(n) for n in range(200)]
    assert deadlines > 0  # the deadlines really cut receives short


async def test_a_cancellation_from_elsewhere_is_raised_not_taken_for_the_deadline() -> None:
    async with socket_pair() as (_, client):
        receiving = ReceiveDeadline()
        task = asyncio.create_task(receiving.receive(client, time.monotonic() + 30))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        receiving.close()


async def test_timers_follow_deadline_moves_not_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle-style deadline ("last frame + 10 s") moves later with every frame: 500 frames arm
    one timer, where a timeout per receive would arm 500."""
    loop = asyncio.get_running_loop()
    armed: list[float] = []
    real_call_later = loop.call_later
    receiving = ReceiveDeadline()

    def counting_call_later(delay: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
        if getattr(callback, "__self__", None) is receiving:  # not websockets' own timers
            armed.append(delay)
        return real_call_later(delay, callback, *args)

    async with socket_pair() as (server, client):
        for n in range(500):
            await server.send(str(n))
        monkeypatch.setattr(loop, "call_later", counting_call_later)
        for n in range(500):
            assert await receiving.receive(client, time.monotonic() + 10) == str(n)
        monkeypatch.undo()
        receiving.close()
    assert len(armed) == 1
