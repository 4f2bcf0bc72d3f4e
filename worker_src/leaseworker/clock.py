"""The worker's one clock: outside the supervisor and the CLI, only this module reads time.

Everything in the worker that needs "now" asks here: `monotonic()` for local deadlines (leases,
sessions, timers' bookkeeping, back-offs), `wall_time()` and `wall_ns()` for what is written to
DynamoDB or compared with it (expiries, grants, removal tombstones).

Which clock answers is a context variable. By default it is the system's (`time.monotonic`,
`time.time`, `time.time_ns`). A simulation installs its own for the tasks it starts
(`using(clock)`), and every task copies the context it was created in, so a worker's loops,
sessions and store calls all read the clock the worker was started under. Nothing patches
`time`, and workers in one process may each run on their own clock (a clock offset), on one
virtual-time event loop (bench/simulator/clock.py). asyncio's own timers (`sleep`, `timeout`)
follow the event loop's `time()`, which such a loop moves too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from time import monotonic as _system_monotonic
from time import time as _system_time
from time import time_ns as _system_time_ns
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def time(self) -> float: ...

    def time_ns(self) -> int: ...


class SystemClock:
    monotonic = staticmethod(_system_monotonic)
    time = staticmethod(_system_time)
    time_ns = staticmethod(_system_time_ns)


SYSTEM: Clock = SystemClock()
_CURRENT: ContextVar[Clock] = ContextVar("leaseworker_clock", default=SYSTEM)


def monotonic() -> float:
    """Seconds on the current clock's monotonic scale: local deadlines only, never stored."""
    return _CURRENT.get().monotonic()


def wall_time() -> float:
    """Seconds since the epoch on the current clock."""
    return _CURRENT.get().time()


def wall_ns() -> int:
    """Nanoseconds since the epoch on the current clock."""
    return _CURRENT.get().time_ns()


def current() -> Clock:
    return _CURRENT.get()


def install(clock: Clock) -> None:
    """Read `clock` from now on in the current context: e.g. run in a copied context that a task
    is then created with (`contextvars.copy_context().run(install, clock)`)."""
    _CURRENT.set(clock)


@contextlib.contextmanager
def using(clock: Clock) -> Iterator[None]:
    """Read `clock` in this context and in every task created inside it."""
    token = _CURRENT.set(clock)
    try:
        yield
    finally:
        _CURRENT.reset(token)
