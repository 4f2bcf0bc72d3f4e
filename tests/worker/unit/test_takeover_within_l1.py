"""A killed worker's connections are all delivered again within L1, not one reconcile later.

Virtual time, the real workers (bench/simulator/dst), three workers at the fault suite's FAST
timings (3 s lease, 1 s heartbeat and reconcile), 30 connections. w1 is killed (no supervisor:
the lease path). Every one of its connections must deliver again, under a higher epoch, within
L1 with no connect allowance (worker/takeover_bound.py; connects take no time here).

Before, some seeds left one or two connections for a second reconcile, 0.4 to 0.8 s past L1:
- a claim that lost its race took the last room, and the free connection behind it was never
  tried in that reconcile (seed 5: 5.21 s);
- a peer fenced on suspicion had leases not yet expired: counted neither free nor as a live
  load, they shrank the survivors' shares (seed 4: 4.81 s).
`tests/system/test_failover.py` saw the same on real processes: 5.98 s against 5.9 s. A third
cause remains (seed 10: 4.47 s against 4.45 s): a peer's fresh claims are counted neither free
nor, until its next heartbeat is listed, as its load; remembering recent counts fixed it but
slowed a scale-out's rebalancing (a shed connection counted twice stayed counted), so it is not
here.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from bench.simulator.clock import VirtualClock, run_virtual
from bench.simulator.dst.run import LOOP_STEP_SECONDS
from bench.simulator.dst.world import Fleet, Timings
from leaseworker.worker.takeover_bound import takeover_bound_s

FAST = Timings(lease_seconds=3.0, heartbeat_seconds=1.0, reconcile_seconds=1.0, checkpoint_seconds=1.0)
PERIOD = 0.05  # a message per connection every 50 ms: a takeover's time to its first delivery


def takeover_times(mode: str, seed: int) -> dict[str, float]:
    """Seconds from w1's kill to each of its connections' first delivery under a new epoch."""
    random.seed(seed)  # the workers' own jitter

    async def main(clock: VirtualClock) -> dict[str, float]:
        rng = random.Random(seed)
        fleet = Fleet(mode, rng, 30, PERIOD, FAST)
        await fleet.add_connections()
        for _ in range(3):
            fleet.start_worker()
            await asyncio.sleep(rng.uniform(0.0, 1.0))
        await asyncio.sleep(15.0 + rng.uniform(0.0, 3.0))
        last = {a.connection_id: a for a in fleet.arrivals.log}
        victims = {cid: a.epoch for cid, a in last.items() if a.worker_id == "w1"}
        killed_at = clock.now
        fleet.kill("w1")
        await asyncio.sleep(4 * FAST.lease_seconds)
        for worker in fleet.live():
            fleet.terminate(worker)
        await asyncio.wait([w.task for w in fleet.workers.values()], timeout=30.0)
        taken: dict[str, float] = {}
        for a in fleet.arrivals.log:
            if a.connection_id in victims and a.epoch > victims[a.connection_id]:
                taken.setdefault(a.connection_id, round(a.at - killed_at, 2))
        assert victims, "w1 held nothing"
        return {cid: taken.get(cid, float("inf")) for cid in victims}

    return run_virtual(main, step=LOOP_STEP_SECONDS)


@pytest.mark.parametrize(
    ("mode", "seed"),
    [("connection", 4), ("connection", 5), ("connection", 16), ("connection", 18), ("session", 3)],
)
def test_every_connection_of_a_killed_worker_is_delivered_again_within_l1(mode: str, seed: int) -> None:
    bound = takeover_bound_s(mode, FAST, connect_s=PERIOD)
    taken = takeover_times(mode, seed)
    late = {cid: t for cid, t in taken.items() if t > bound}
    assert not late, f"past L1 ({bound:.2f} s): {late}; all: {sorted(taken.values())}"
