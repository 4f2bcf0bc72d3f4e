"""A connection stopped while its connection-mode holder is cut off is freed, and removable.

Virtual time, the real workers (bench/simulator/dst), connection mode at 6 s / 2 s. w2 is cut off
from DynamoDB for three leases; a second later the operator stops one of its connections. w1
fences w2 (suspected: its `hb` stood still for a lease), but a suspected connection-mode holder
may still deliver until its lease expires, so nothing is claimed or freed before that; and a
STOPPED connection is never claimed. Before, the item named w2 for good: `connections remove`
was refused ("still held by w2") however long the operator waited, and the fenced session was
never reaped. Now a survivor frees it once its lease has expired (the orphan query's own test,
now minus the clock skew), keeping its checkpoint; plain `remove` then succeeds. Found by the
simulation (seed 63, mixed, once slow replies reached past L − H).
"""

from __future__ import annotations

import asyncio
import random

from bench.simulator.clock import VirtualClock, run_virtual
from bench.simulator.dst import checks
from bench.simulator.dst.run import LOOP_STEP_SECONDS
from bench.simulator.dst.world import TABLE, Fleet, Timings
from leaseworker.lease.removal import NotRemovable

TIMINGS = Timings(lease_seconds=6.0, heartbeat_seconds=2.0, reconcile_seconds=2.0, checkpoint_seconds=2.0)
FREED_WITHIN = 3 * TIMINGS.lease_seconds  # from the stop: the lease runs out, then a round frees it


def holder(fleet: Fleet, cid: str) -> str | None:
    owner = fleet.database.tables[TABLE].items[cid].get("lease_owner")
    return None if owner is None else str(owner["S"])


async def stop_while_cut_off(clock: VirtualClock) -> tuple[str, list[tuple[float, str | None]], str, Fleet]:
    fleet = Fleet("connection", random.Random(3), 6, 0.5, TIMINGS)
    await fleet.add_connections()
    fleet.start_worker()
    await asyncio.sleep(1.0)
    cut_off = fleet.start_worker()
    await asyncio.sleep(12.0)
    cid = next(c for c in fleet.ids if holder(fleet, c) == cut_off)
    fleet.partition(cut_off, 3 * TIMINGS.lease_seconds)
    await asyncio.sleep(1.0)
    admin = fleet.admin()
    await admin.stop(cid)
    stopped_at = clock.now
    owners: list[tuple[float, str | None]] = []
    while clock.now - stopped_at < FREED_WITHIN:
        owners.append((round(clock.now - stopped_at, 1), holder(fleet, cid)))
        await asyncio.sleep(0.5)
    try:
        await admin.remove(cid)
        removed = "removed"
    except NotRemovable as refused:
        removed = str(refused)
    for worker in fleet.live():
        fleet.terminate(worker)
    await asyncio.wait([w.task for w in fleet.workers.values()], timeout=30.0)
    return cut_off, owners, removed, fleet


def test_a_connection_stopped_while_its_holder_is_cut_off_is_freed_once_its_lease_expired() -> None:
    cut_off, owners, removed, fleet = run_virtual(stop_while_cut_off, step=LOOP_STEP_SECONDS)
    freed = [at for at, owner in owners if owner is None]
    assert freed, f"still held by {cut_off} {FREED_WITHIN:g} s after the stop: {owners}"
    # Not before its lease could have run out: renewed at most H before the cut, stopped 1 s in.
    assert freed[0] >= TIMINGS.lease_seconds - TIMINGS.heartbeat_seconds - 1.0, owners
    assert all(owner is None for at, owner in owners if at >= freed[0]), owners
    assert removed == "removed", removed
    assert checks.one_deliverer(fleet.arrivals.log) == []
    assert checks.no_loss(fleet.arrivals.log) == []
