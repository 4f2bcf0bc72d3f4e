"""Virtual time: an asyncio loop whose clock jumps to the next timer, and the lease code's clocks.

The loop is an ordinary SelectorEventLoop whose `time()` is the virtual clock and whose selector
never blocks: where a real loop would sleep until its next timer, this one moves the clock
there. Every `asyncio.sleep`, `asyncio.timeout` and `wait_for` in the real lease code and in the
simulated workers therefore runs in virtual time, and a run is deterministic for a seed.

The lease modules read the clock through their module-level `time` (`time.monotonic()` for local
deadlines, `time.time_ns()` in `dynamodb.now_ms()`, which the stores import). `virtual_clocks`
replaces that name in those modules, and only there, for the duration of a run: no file under
worker_src changes. Every worker shares one wall clock (no skew is simulated).
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import time
from collections.abc import Callable, Coroutine, Iterator
from types import ModuleType
from typing import Any, TypeVar

from leaseworker.lease import connection_store, dynamodb, ownership, session_leases

T = TypeVar("T")
EPOCH_SECONDS = 1_800_000_000.0  # the wall clock at virtual time 0 (2027-01-15)
PATCHED: tuple[ModuleType, ...] = (dynamodb, connection_store, ownership, session_leases)


class Deadlock(RuntimeError):
    """Nothing is scheduled and nothing is ready: the simulation would wait forever."""


class VirtualClock:
    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return EPOCH_SECONDS + self.now

    def time_ns(self) -> int:
        return round((EPOCH_SECONDS + self.now) * 1e9)

    def __getattr__(self, name: str) -> Any:  # anything else the modules use from `time`
        return getattr(time, name)


class _Selector:
    """The real selector (the loop's self-pipe needs one), polled without waiting."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self._real = selectors.DefaultSelector()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise Deadlock("no timer is scheduled and no callback is ready")
        if timeout > 0:
            self._clock.now += timeout
        return self._real.select(0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def virtual_loop(clock: VirtualClock) -> asyncio.AbstractEventLoop:
    loop = asyncio.SelectorEventLoop(_Selector(clock))  # type: ignore[arg-type]
    loop.time = clock.monotonic  # type: ignore[method-assign]
    loop._clock_resolution = 1e-9  # type: ignore[attr-defined]  # timers fire at their exact time
    return loop


@contextlib.contextmanager
def virtual_clocks(clock: VirtualClock) -> Iterator[None]:
    saved = [(module, getattr(module, "time")) for module in PATCHED]  # noqa: B009
    try:
        for module in PATCHED:
            setattr(module, "time", clock)  # noqa: B010
        yield
    finally:
        for module, original in saved:
            setattr(module, "time", original)  # noqa: B010


def run_virtual(main: Callable[[VirtualClock], Coroutine[Any, Any, T]], *, start: float = 0.0) -> T:
    """Run `main(clock)` to completion on a virtual-time loop with the lease clocks patched."""
    clock = VirtualClock(start)
    loop = virtual_loop(clock)
    try:
        with virtual_clocks(clock):
            return loop.run_until_complete(main(clock))
    finally:
        loop.close()
