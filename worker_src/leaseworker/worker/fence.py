"""The self-fencing timer of one lease (docs/design.md §2d): fires the moment its local deadline passes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from leaseworker.lease.model import Lease, LeaseState


class LeaseFence:
    """Calls `on_expiry` once the lease's `valid_until` passes without a renewal moving it.

    Renewals only ever move `valid_until` later, so on each wake-up the timer either fires or
    sleeps again until the new deadline. A lease already LOST needs no fence."""

    def __init__(self, lease: Lease, on_expiry: Callable[[], None]) -> None:
        self._lease = lease
        self._on_expiry = on_expiry
        self._timer: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        loop = asyncio.get_running_loop()

        def check() -> None:
            if self._lease.state is LeaseState.LOST:
                return
            if time.monotonic() >= self._lease.valid_until:
                self._on_expiry()
                return
            self._timer = loop.call_at(_loop_time(loop, self._lease.valid_until), check)

        self._timer = loop.call_at(_loop_time(loop, self._lease.valid_until), check)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def _loop_time(loop: asyncio.AbstractEventLoop, monotonic_deadline: float) -> float:
    return loop.time() + (monotonic_deadline - time.monotonic())
