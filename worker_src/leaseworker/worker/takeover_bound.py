"""docs/design.md §2c L1, written once: how long a lost connection may stay unserved.

- Connection mode: the lease runs out, plus the clock-skew allowance, and then the longest
  (jittered) reconcile period finds it.
- Session mode: the dead session's counter stands still for one lease on an observer's clock. It
  is first seen up to one listing (a heartbeat) after it was written, then the fence, and the
  rendezvous claim order (up to two steps).
- Both modes add `connect_s`, an allowance for the connect and subscribe on the machine at hand,
  and `paced_s`, the connect budget's term (lease/budget_store.paced_term_s, docs/tuning.md).

The chaos verdicts, the local fleet's live view and the system tests all compute L1 here, from the
worker's own constants, so the bound they check cannot drift from the rules it describes.
"""

from __future__ import annotations

from typing import Protocol

from leaseworker.worker.acquirer import RECONCILE_JITTER
from leaseworker.worker.peers import TAKEOVER_STEP_SECONDS

SESSION_OBSERVATION_HEARTBEATS = 2  # seen up to one listing late, on a heartbeat's granularity
SESSION_CLAIM_STEPS = 2  # the rendezvous rank of the claimer, for a fleet of three


class LeaseTimings(Protocol):
    """What the bound reads: Settings, or the local fleet's Timings."""

    @property
    def lease_seconds(self) -> float: ...
    @property
    def heartbeat_seconds(self) -> float: ...
    @property
    def reconcile_seconds(self) -> float: ...
    @property
    def max_clock_skew_ms(self) -> int: ...


def takeover_bound_s(mode: str, timings: LeaseTimings, connect_s: float, paced_s: float = 0.0) -> float:
    """L1 in seconds for `mode` ("connection" or "session") at `timings`."""
    if mode == "connection":
        reconcile = timings.reconcile_seconds * (1 + RECONCILE_JITTER)  # the longest period
        return timings.lease_seconds + timings.max_clock_skew_ms / 1000 + reconcile + connect_s + paced_s
    return (
        timings.lease_seconds
        + SESSION_OBSERVATION_HEARTBEATS * timings.heartbeat_seconds
        + SESSION_CLAIM_STEPS * TAKEOVER_STEP_SECONDS
        + connect_s
        + paced_s
    )
