"""Virtual time: an asyncio loop whose clock jumps to the next timer, and the lease code's clocks.

The loop is an ordinary SelectorEventLoop whose `time()` is the virtual clock and whose selector
never blocks: where a real loop would sleep until its next timer, this one moves the clock
there. Every `asyncio.sleep`, `asyncio.timeout` and `wait_for` in the real lease code and in the
simulated workers therefore runs in virtual time, and a run is deterministic for a seed.

The worker's code reads time only through `leaseworker.clock`, whose clock is a context
variable: `run_virtual` installs the virtual clock for the run (`leaseworker.clock.using`), so
every lease deadline, expiry and grant reads virtual time, and nothing patches `time`. Every
worker shares one wall clock here (no skew is simulated).
"""

from __future__ import annotations

import asyncio
import collections
import selectors
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from typing import Any, TypeVar

from leaseworker.clock import using

T = TypeVar("T")
EPOCH_SECONDS = 1_800_000_000.0  # the wall clock at virtual time 0 (2027-01-15)


class Deadlock(RuntimeError):
    """Nothing is scheduled and nothing is ready: the simulation would wait forever."""


class Process:
    """One simulated process. While `paused` (SIGSTOP), none of its callbacks run: every handle
    of a task started in its context (`PROCESS`) waits, timers and I/O wake-ups alike, and runs
    in order once it resumes (SIGCONT). Its clocks go on, as a host's do."""

    def __init__(self) -> None:
        self.paused = False
        self.held: list[asyncio.Handle] = []


PROCESS: ContextVar[Process | None] = ContextVar("simulated_process", default=None)


class _Ready(collections.deque[asyncio.Handle]):
    """The loop's ready queue, holding back the handles of a paused process (clock.Process)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._skip = asyncio.Handle(lambda: None, (), loop)
        self._skip.cancel()  # the loop passes over a cancelled handle

    def popleft(self) -> asyncio.Handle:
        handle = super().popleft()
        process = handle._context.get(PROCESS)  # type: ignore[attr-defined]
        if process is not None and process.paused:
            process.held.append(handle)
            return self._skip
        return handle


def resume(loop: asyncio.AbstractEventLoop, process: Process) -> None:
    """SIGCONT: what `process` was held from running, runs now, in its order."""
    process.paused = False
    held, process.held = process.held, []
    loop._ready.extend(held)  # type: ignore[attr-defined]


class VirtualClock:
    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return EPOCH_SECONDS + self.now

    def time_ns(self) -> int:
        return round((EPOCH_SECONDS + self.now) * 1e9)


class _Selector:
    """The real selector (the loop's self-pipe needs one), polled without waiting."""

    def __init__(self, clock: VirtualClock, step: float) -> None:
        self._clock = clock
        self._real = selectors.DefaultSelector()
        self._step = step

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise Deadlock("no timer is scheduled and no callback is ready")
        self._clock.now += max(timeout, self._step)
        return self._real.select(0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def virtual_loop(clock: VirtualClock, *, step: float = 0.0) -> asyncio.AbstractEventLoop:
    """`step`: virtual seconds that every loop iteration takes (0: none). With none, code that
    waits "until t" can spin: a timer due a rounding error from now fires at once, and the
    clock, which moves only when nothing is ready, never reaches t. A real loop spins there for
    a moment; a virtual one forever. The fleet simulation (bench/simulator/dst) takes 1 µs."""
    loop = asyncio.SelectorEventLoop(_Selector(clock, step))  # type: ignore[arg-type]
    loop._ready = _Ready(loop)  # type: ignore[attr-defined]
    loop.time = clock.monotonic  # type: ignore[method-assign]
    loop._clock_resolution = 1e-9  # type: ignore[attr-defined]  # timers fire at their exact time
    return loop


def run_virtual(
    main: Callable[[VirtualClock], Coroutine[Any, Any, T]], *, start: float = 0.0, step: float = 0.0
) -> T:
    """Run `main(clock)` to completion on a virtual-time loop, the worker's code reading its clock."""
    clock = VirtualClock(start)
    loop = virtual_loop(clock, step=step)
    try:
        with using(clock):
            return loop.run_until_complete(main(clock))
    finally:
        loop.close()
