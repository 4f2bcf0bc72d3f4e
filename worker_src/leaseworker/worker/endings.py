"""How a session, or one socket of it, ends.

`SessionResult` (an `Outcome` and its reason) is what the worker acts on when a session ends.
`Stop` carries one out of the delivery path (worker/socket_run.py, worker/socket_actions.py,
`ConnectionSession.deliver`) to the session's loop; `SinkFailed` ends only the socket: the
session resubscribes after the last delivered seq.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Outcome(enum.Enum):
    RELEASE = "release"  # shutdown, the connection was STOPPED, or another epoch owns it: release
    LOST = "lost"  # the lease is gone (taken over, removed, self-fenced): write nothing more
    FAILED = "failed"  # the connection can never work as configured: mark it failed


@dataclass(frozen=True, slots=True)
class SessionResult:
    outcome: Outcome
    reason: str


class _SinkFailed(Exception):
    """Internal: the sink refused a batch; resubscribe after the last delivered seq. `permanent`:
    the next record can never be accepted (SinkError.permanent), a failure at this position."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class Stop(Exception):
    """Leave the delivery loop with a result."""

    def __init__(self, result: SessionResult) -> None:
        super().__init__(result.reason)
        self.result = result


SinkFailed = _SinkFailed
