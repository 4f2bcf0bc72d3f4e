"""A stop signal that comes while the worker child is still starting (importing its stack).

The worker's own handlers (worker/main.py `run_worker`) are installed on its event loop, after
the imports of the CLI, aioboto3 and the worker's modules: about 1.5 s of CPU, more on a busy
or cold host. A SIGTERM in that window (ECS stopping a task just started, a rolling restart
overtaking a start-up) met the default action: the child died of the signal, and the supervisor
took it for a crash (exit 143) and fenced a session that was never written. `hold()` is called
first thing in `python -m leaseworker run --child`; it only records the signal, and `run_worker`
asks `requested()` once its own handlers are in place. Standard library only, so that it is in
place before anything slow is imported.
"""

from __future__ import annotations

import signal
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_received: list[int] = []


def _record(signum: int, _frame: FrameType | None) -> None:
    _received.append(signum)


def hold() -> None:
    """Record SIGTERM and SIGINT instead of dying of them, until the worker's handlers replace these."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _record)


def requested() -> bool:
    """A stop signal came before the worker's own handlers were installed."""
    return bool(_received)
