"""Hints are handled concurrently, and a hint that arrives while its connection's is in flight
runs again afterwards (worker/hints.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

from leaseworker.notify import Hint
from leaseworker.worker.hints import HINTS_IN_FLIGHT, Hints


class RecordingHints(Hints):
    """The dispatch under test, with `on_changed` replaced by a probe that waits for a gate."""

    def __init__(self, stop: asyncio.Event) -> None:
        unused = cast(Any, None)
        super().__init__(
            ownership=unused, registry=unused, acquirer=unused, relay=unused, stop_acquiring=stop
        )
        self.started: list[str] = []
        self.finished: list[str] = []
        self.gate = asyncio.Event()
        self.all_started = asyncio.Event()
        self.expect = 0
        self.progress = asyncio.Condition()

    async def on_changed(self, hint: Hint) -> None:
        connection_id = hint.connection_id
        self.started.append(connection_id)
        if len(self.started) >= self.expect:
            self.all_started.set()
        await self.gate.wait()
        self.finished.append(connection_id)
        async with self.progress:
            self.progress.notify_all()

    async def until_finished(self, count: int) -> None:
        async with self.progress:
            await asyncio.wait_for(self.progress.wait_for(lambda: len(self.finished) >= count), 5)


def source_of(ids: list[str], done: asyncio.Event) -> Any:
    async def source(stop: asyncio.Event) -> AsyncIterator[Hint]:
        for connection_id in ids:
            yield Hint(connection_id)
        done.set()
        await stop.wait()

    return source


async def test_hints_run_concurrently_and_a_repeat_runs_after_the_first() -> None:
    stop = asyncio.Event()
    hints = RecordingHints(stop)
    hints.expect = 3  # a, b, c at once; the second "a" waits for the first
    yielded = asyncio.Event()
    runner = asyncio.create_task(hints.run(source_of(["a", "b", "a", "c"], yielded)))
    await asyncio.wait_for(hints.all_started.wait(), 5)  # serial handling would block on "a"
    await yielded.wait()
    assert sorted(hints.started) == ["a", "b", "c"]
    hints.gate.set()
    await hints.until_finished(4)
    assert sorted(hints.finished) == ["a", "a", "b", "c"]
    assert hints.started.count("a") == 2
    stop.set()
    await asyncio.wait_for(runner, 5)


async def test_at_most_hints_in_flight_at_once() -> None:
    stop = asyncio.Event()
    hints = RecordingHints(stop)
    hints.expect = HINTS_IN_FLIGHT
    ids = [f"c{i}" for i in range(HINTS_IN_FLIGHT + 4)]
    runner = asyncio.create_task(hints.run(source_of(ids, asyncio.Event())))
    await asyncio.wait_for(hints.all_started.wait(), 5)
    await asyncio.sleep(0.05)
    assert len(hints.started) == HINTS_IN_FLIGHT  # the rest wait for a slot
    hints.gate.set()
    await hints.until_finished(len(ids))
    stop.set()
    await asyncio.wait_for(runner, 5)
