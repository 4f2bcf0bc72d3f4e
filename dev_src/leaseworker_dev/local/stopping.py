"""Ctrl-C, SIGTERM and SIGHUP as a request to stop `leaseworker local up`, however it was started.

Python turns SIGINT into KeyboardInterrupt only if SIGINT was not ignored when the interpreter
started. A non-interactive shell starts background jobs (`make test > log &`, a CI script) with
SIGINT ignored, and every descendant inherits that: the live view then never saw Ctrl-C at all.
And a KeyboardInterrupt raised at an arbitrary bytecode lands wherever the main thread happens to
be: inside the DynamoDB client's event loop, inside rich writing a frame, inside a destructor
(where Python prints it and drops it).

`StopSignals` installs its own handler for the three signals, whatever was inherited. Inside
`raising()` (start-up, where no loop checks a flag) the first one raises KeyboardInterrupt.
Elsewhere a signal is only recorded, and `wait()` returns at once: its select() includes a pipe
that the interpreter writes to on every signal (`signal.set_wakeup_fd`).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class StopSignals:
    """While entered (main thread only): SIGINT, SIGTERM and SIGHUP request a stop."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self._raising = False
        self._wake_read = -1
        self._wake_write = -1
        self._previous_wakeup = -1
        self._previous: dict[int, Handler] = {}

    def __enter__(self) -> StopSignals:
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._previous_wakeup = signal.set_wakeup_fd(self._wake_write, warn_on_full_buffer=False)
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        signal.set_wakeup_fd(self._previous_wakeup)
        os.close(self._wake_read)
        os.close(self._wake_write)

    @property
    def requested(self) -> bool:
        return self.received is not None

    @contextlib.contextmanager
    def raising(self) -> Iterator[None]:
        """Within: the first stop signal raises KeyboardInterrupt (for code with no loop to check
        `requested`). A stop requested before, or swallowed on the way, raises on leaving."""
        if self.requested:
            raise KeyboardInterrupt
        self._raising = True
        try:
            yield
        finally:
            self._raising = False
        if self.requested:
            raise KeyboardInterrupt

    def hang_up(self) -> None:
        """The terminal went away without a SIGHUP reaching this process (it was not the
        terminal's session leader): the same stop request as SIGHUP."""
        if self.received is None:
            self.received = signal.SIGHUP

    def wait(self, timeout: float, fds: Sequence[int] = ()) -> list[int]:
        """Up to `timeout` s for one of `fds` to become readable; at once when a stop is requested.

        Returns the readable ones among `fds` (none when it timed out or a stop was requested).
        """
        if self.requested:
            return []
        ready, _, _ = select.select([self._wake_read, *fds], [], [], timeout)
        if self._wake_read in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(self._wake_read, 512):
                    pass
        return [] if self.requested else [fd for fd in ready if fd != self._wake_read]

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)
        if self._raising:
            self._raising = False  # once: the cleanup that follows must not be interrupted
            raise KeyboardInterrupt
