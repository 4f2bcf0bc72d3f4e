"""A socket's receive with a deadline, on one timer that moves lazily.

A session's receive must end at its next deadline (the batch's linger, the adapter's idle, ping or
rotation timer). `asyncio.timeout` around each `recv()` arms a timer and cancels it again for
every frame, and most deadlines only move later as frames arrive (an idle timer is "last frame +
idle"). Here one timer per socket run stays armed: a later deadline does not touch it; when it
fires early it re-arms itself for the deadline that stands then, and only a deadline that has
really passed, while the task waits in `recv()`, cancels the receive. An earlier deadline (a batch's
linger starting) re-arms it at once. Timer operations then follow batches and idle periods, not
frames (issue 25: P5 measured the per-frame timer at about a fifth of the worker's time).

The cancellation is `asyncio.timeout`'s own: `task.cancel()`, told apart from any other
cancellation by `uncancel()` (a shutdown's cancel is raised as it is). Cancelling websockets'
`recv()` is safe: no frame is lost.
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Final

from leaseworker.clock import monotonic

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

# `receive` returns this instead of a frame when the deadline passed first.
DEADLINE: Final = object()


class ReceiveDeadline:
    """One per socket run, used by its own task only; `close()` when the run ends."""

    def __init__(self) -> None:
        self._task: asyncio.Task[object] | None = None  # the task waiting in receive()
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at = math.inf  # when the armed timer fires (monotonic)
        self._deadline = math.inf  # the deadline of the receive in progress
        self._waiting = False
        self._fired = False

    async def receive(self, ws: ClientConnection, deadline: float) -> object:
        """The next frame (str or bytes), or DEADLINE once monotonic() reaches `deadline`
        (math.inf: none). ConnectionClosed and other cancellations are raised as they are."""
        now = monotonic()
        if deadline <= now:
            return DEADLINE
        task = self._task = asyncio.current_task()
        assert task is not None
        self._deadline = deadline
        if deadline < self._armed_at:
            self._arm(deadline, now)
        self._fired = False
        self._waiting = True
        cancelling = task.cancelling()
        try:
            return await ws.recv()
        except asyncio.CancelledError:
            if self._fired and task.uncancel() <= cancelling:
                return DEADLINE
            raise
        finally:
            self._waiting = False

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._armed_at = math.inf

    def _arm(self, at: float, now: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed_at = at
        self._handle = asyncio.get_running_loop().call_later(max(0.0, at - now), self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._armed_at = math.inf
        if not self._waiting:
            return  # the task is busy with a frame; its next receive arms the timer again
        now = monotonic()
        if now < self._deadline:  # the deadline moved later since the timer was armed
            if self._deadline != math.inf:
                self._arm(self._deadline, now)
            return
        self._fired = True
        assert self._task is not None
        self._task.cancel()
