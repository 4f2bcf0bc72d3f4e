"""The self-fencing timer of one lease (docs/design.md §2d): fires the moment its local deadline passes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from leaseworker.clock import monotonic
from leaseworker.lease.model import Lease, LeaseState

RECHECK_SECONDS = 0.02  # past the deadline with a renewal in flight: how often to look again


class LeaseFence:
    """Calls `on_expiry` once the lease's `valid_until` passes without a renewal moving it.

    Renewals only ever move `valid_until` later, so on each wake-up the timer either fires or
    sleeps again until the new deadline. A lease already LOST needs no fence. Past the deadline
    with a renewal still in flight (`Lease.awaiting_renewal`), it looks again every
    RECHECK_SECONDS until that renewal has answered: the session delivers nothing meanwhile."""

    def __init__(self, lease: Lease, on_expiry: Callable[[], None]) -> None:
        self._lease = lease
        self._on_expiry = on_expiry
        self._timer: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        loop = asyncio.get_running_loop()

        def check() -> None:
            if self._lease.state is LeaseState.LOST:
                return
            now = monotonic()
            if self._lease.awaiting_renewal(now):
                self._timer = loop.call_later(RECHECK_SECONDS, check)
                return
            if now >= self._lease.valid_until:
                self._on_expiry()
                return
            self._timer = loop.call_at(_loop_time(loop, self._lease.valid_until), check)

        self._timer = loop.call_at(_loop_time(loop, self._lease.valid_until), check)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def _loop_time(loop: asyncio.AbstractEventLoop, monotonic_deadline: float) -> float:
    return loop.time() + (monotonic_deadline - monotonic())
