"""A session-mode lease waits for the heartbeat in flight past its deadline, in virtual time.

The real worker runs in session mode against the in-memory DynamoDB (bench/simulator/dst),
alone, at lease 6 s / heartbeat 2 s (fence margin 0.6 s), while every DynamoDB call of its takes
`slow` seconds more for 20 s. A heartbeat sent at s that lands extends every lease to
s + 5.4 s, so with heartbeats every H = 2 s the deadline passes before the next one lands once
the round trip R exceeds 5.4 − 2 = 3.4 s:
- below that nothing pauses;
- between that and 2H = 4 s, each lease waits for the heartbeat sent before its deadline
  (`SessionLeases.heartbeat_in_flight`, `Lease.awaiting_renewal`), delivers nothing meanwhile,
  and is kept when it lands. This used to be a cliff: the session lapsed and every lease moved;
- past 2H the heartbeat due finds the lease already past its deadline, so the wait is bounded:
  the leases lapse, are handed back and claimed again under a new epoch.

Judged from the table (each connection's epoch) and the sink (one deliverer per record, none lost).
"""

from __future__ import annotations

import asyncio
import random

import pytest

from bench.simulator.clock import VirtualClock, run_virtual
from bench.simulator.dst import checks
from bench.simulator.dst.run import LOOP_STEP_SECONDS
from bench.simulator.dst.world import TABLE, Fleet, Timings

TIMINGS = Timings(lease_seconds=6.0, heartbeat_seconds=2.0, reconcile_seconds=2.0, checkpoint_seconds=2.0)
SLOW_FOR = 20.0  # seconds of slow replies: ten heartbeats
CONNECTIONS = 8


def epochs(fleet: Fleet) -> dict[str, int]:
    items = fleet.database.tables[TABLE].items
    return {cid: int(items[cid]["lease_epoch"]["N"]) for cid in fleet.ids}


async def slow_dynamodb(clock: VirtualClock, slow: float) -> tuple[dict[str, int], dict[str, int], Fleet]:
    fleet = Fleet("session", random.Random(7), CONNECTIONS, 0.5, TIMINGS)
    await fleet.add_connections()
    worker = fleet.start_worker()
    await asyncio.sleep(10.0)
    before = epochs(fleet)
    link = fleet.workers[worker].link
    link.slow_seconds = slow
    link.slow_until = clock.now + SLOW_FOR
    await asyncio.sleep(SLOW_FOR + 3 * TIMINGS.lease_seconds)  # a lapse and its claim show by then
    after = epochs(fleet)
    fleet.terminate(worker)
    await asyncio.wait([fleet.workers[worker].task], timeout=30.0)
    return before, after, fleet


@pytest.mark.parametrize(
    ("slow", "kept"),
    [(3.0, True), (3.7, True), (4.6, False)],
    ids=["below-the-deadline", "past-the-deadline-within-2H", "past-2H"],
)
def test_a_session_keeps_its_leases_while_a_heartbeat_sent_in_time_is_in_flight(
    slow: float, kept: bool
) -> None:
    async def main(clock: VirtualClock) -> tuple[dict[str, int], dict[str, int], Fleet]:
        return await slow_dynamodb(clock, slow)

    before, after, fleet = run_virtual(main, step=LOOP_STEP_SECONDS)
    assert sorted(before) == fleet.ids and set(before.values()) == {1}, before
    moved = {cid: (before[cid], after[cid]) for cid in before if after[cid] != before[cid]}
    if kept:
        assert not moved, f"a slow but timely DynamoDB (R = {slow} s) moved leases: {moved}"
    else:
        assert sorted(moved) == fleet.ids, f"R = {slow} s is past 2H: every lease lapses ({moved})"
    log = fleet.arrivals.log
    assert checks.one_deliverer(log) == []
    assert checks.no_loss(log) == []
    assert fleet.workers[next(iter(fleet.workers))].ended == "stopped"
