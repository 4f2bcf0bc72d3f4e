"""Run one schedule against the real workers in virtual time, and judge it (§2c, never stranded).

The run is deterministic for its seed: one virtual-time loop, seeded randomness (the workers'
own jitter included), and string hashing fixed by PYTHONHASHSEED (`__main__` sets it).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import math
import random
from dataclasses import dataclass, field

from bench.simulator.clock import VirtualClock, run_virtual
from bench.simulator.dst import checks
from bench.simulator.dst.schedule import Fault, Schedule
from bench.simulator.dst.sink import Arrival
from bench.simulator.dst.world import TABLE, Fleet, Timings
from leaseworker.lease.attribute_values import checkpoint_key
from leaseworker.lease.checkpoint_store import effective_checkpoint, entries_from
from leaseworker.lease.removal import NotRemovable

PERIOD = 0.5  # a message per connection every half second
SAMPLE_SECONDS = 0.25  # how often the table's checkpoints are read for S3
STORE_FAULTS = frozenset({"partition", "lost_replies", "slow_replies", "throttle", "pause"})
STORE_CALL_SECONDS = 5.0  # a lease store call's deadline (lease/connection_reads.py, session_store.py)
REMOVE_WITHIN = 60.0  # a STOPPED connection is handed back, and so removable, within this
LOOP_STEP_SECONDS = 1e-6  # each loop iteration takes a microsecond (clock.virtual_loop)


@dataclass
class Verdict:
    schedule: Schedule
    violations: list[str] = field(default_factory=list)
    delivered: int = 0
    virtual_seconds: float = 0.0
    ended: dict[str, str] = field(default_factory=dict)

    digest: str = ""  # of every arrival at the sink: equal digests, equal runs

    @property
    def ok(self) -> bool:
        return not self.violations


DEFAULT_TIMINGS = Timings()


def run(plan: Schedule, timings: Timings = DEFAULT_TIMINGS) -> Verdict:
    random.seed(plan.seed)  # the workers' own jitter (acquirer, backoff) draws from here

    async def main(clock: VirtualClock) -> Verdict:
        return await _run(plan, timings, clock)

    return run_virtual(main, step=LOOP_STEP_SECONDS)


async def _run(plan: Schedule, timings: Timings, clock: VirtualClock) -> Verdict:
    rng = random.Random(plan.seed)
    fleet = Fleet(plan.mode, rng, plan.connections, PERIOD, timings, clock_offsets=plan.clock_offsets)
    await fleet.add_connections()
    for _ in range(plan.workers):
        fleet.start_worker()
        await asyncio.sleep(rng.uniform(0.0, 1.0))
    history: dict[str, list[tuple[float, int]]] = {cid: [] for cid in fleet.ids}
    sampler = asyncio.get_running_loop().create_task(_sample(fleet, history))
    pending: list[asyncio.Task[None]] = []
    for fault in plan.faults:
        await asyncio.sleep(max(0.0, fault.at - clock.now))
        pending.append(asyncio.get_running_loop().create_task(_inject(fleet, fault, rng)))
    await asyncio.sleep(max(0.0, plan.horizon - clock.now))
    await asyncio.gather(*pending)
    if not fleet.live():
        fleet.start_worker()
    # Settled: a takeover's time (L1: lease, skew, a heartbeat and a reconcile, connect) has passed.
    t = timings
    settle = t.lease_seconds + t.max_clock_skew_ms / 1000 + t.heartbeat_seconds + t.reconcile_seconds + 2.0
    await asyncio.sleep(settle)
    settled_at = clock.now
    await asyncio.sleep(3 * PERIOD + t.checkpoint_seconds)
    verdict = Verdict(plan, virtual_seconds=clock.now)
    serving = [cid for cid in fleet.ids if cid not in fleet.removed]
    verdict.violations += checks.served(fleet.arrivals.log, serving, since=settled_at) + fleet.refusals
    for worker_id in fleet.live():  # an ordered shutdown of all: the final checkpoints land
        fleet.terminate(worker_id)
    await asyncio.wait([w.task for w in fleet.workers.values()], timeout=30.0)
    await asyncio.sleep(SAMPLE_SECONDS * 2)
    sampler.cancel()
    log = fleet.arrivals.log
    verdict.violations += checks.one_deliverer(log) + checks.no_loss(log) + checks.checkpoints(history, log)
    verdict.violations += checks.stopped(log, fleet.stops, within=functools.partial(_notice, plan, t))
    verdict.ended = {w: worker.ended or "still running" for w, worker in fleet.workers.items()}
    verdict.violations += [
        f"worker {w} {why}" for w, why in verdict.ended.items() if why.startswith(("crashed", "still"))
    ]
    verdict.delivered = len(log)
    verdict.digest = hashlib.sha256(repr([vars_of(a) for a in log]).encode()).hexdigest()[:16]
    return verdict


def _notice(plan: Schedule, t: Timings, stopped_at: float) -> float:
    """How long the workers may take to obey a stop: a reconcile (session mode) or a renewal
    (connection mode), a heartbeat and a second; and where a fault kept a worker from DynamoDB
    (a partition, lost, slow or throttled replies, a pause) around then, until it ended and one
    store call's deadline more (a call sent into it hangs until then)."""
    base = max(t.reconcile_seconds, t.heartbeat_seconds) + t.heartbeat_seconds + 1.0
    extra = 0.0
    for fault in plan.faults:
        if fault.kind not in STORE_FAULTS:
            continue
        ends = fault.at + fault.seconds
        if fault.at <= stopped_at + base and ends >= stopped_at - STORE_CALL_SECONDS:
            extra = max(extra, ends - stopped_at + STORE_CALL_SECONDS)
    return base + extra


def vars_of(arrival: Arrival) -> tuple[float, str, str, int, int]:
    return (round(arrival.at, 9), arrival.worker_id, arrival.connection_id, arrival.epoch, arrival.seq)


async def _inject(fleet: Fleet, fault: Fault, rng: random.Random) -> None:
    live = fleet.live()
    if fault.kind == "scale_out" or not live:
        fleet.start_worker()
        return
    if fault.kind in ("stop_start", "remove"):
        await _operate(fleet, fault, rng)
        return
    victim = rng.choice(live)
    if fault.kind == "kill":
        fleet.kill(victim)
    elif fault.kind == "terminate":
        fleet.terminate(victim)
    elif fault.kind == "partition":
        fleet.partition(victim, fault.seconds)
        return
    elif fault.kind == "pause":
        fleet.pause(victim, fault.seconds)
        return
    elif fault.kind == "lost_replies":
        link = fleet.workers[victim].link
        link.lose_replies = 0.3
        await asyncio.sleep(fault.seconds)
        link.lose_replies = 0.0
        return
    elif fault.kind == "slow_replies":  # a spike of 1.2-4.5 s at 6/2: past the deadlines, 2H and L - H
        link = fleet.workers[victim].link
        link.slow_seconds = rng.uniform(0.2, 0.75) * fleet.timings.lease_seconds
        link.slow_until = asyncio.get_running_loop().time() + fault.seconds
        return
    elif fault.kind == "throttle":
        link = fleet.workers[victim].link
        link.throttle_share = rng.uniform(0.3, 0.9)
        link.throttled_until = asyncio.get_running_loop().time() + fault.seconds
        return
    if fault.replace_after is not None:
        await asyncio.sleep(fault.replace_after)
        fleet.start_worker()


async def _operate(fleet: Fleet, fault: Fault, rng: random.Random) -> None:
    """An operator stops a connection and starts it again, or stops and removes it (the CLI's
    `remove`, retried until the workers have let it go)."""
    free = [cid for cid in fleet.ids if cid not in fleet.operated and cid not in fleet.removed]
    if not free:
        return
    cid = rng.choice(free)
    fleet.operated.add(cid)
    admin = fleet.admin()
    loop = asyncio.get_running_loop()
    await admin.stop(cid)
    stopped = loop.time()
    if fault.kind == "stop_start":
        await asyncio.sleep(fault.seconds)
        await admin.start(cid)
        fleet.stops.append((cid, stopped, loop.time()))
    else:
        fleet.stops.append((cid, stopped, math.inf))
        deadline = loop.time() + REMOVE_WITHIN
        while True:
            try:
                await admin.remove(cid)
                break
            except NotRemovable as refused:  # still held: its owner has not handed it back yet
                if loop.time() > deadline:
                    fleet.refusals.append(f"remove {cid}: refused for {REMOVE_WITHIN:.0f} s ({refused})")
                    break
                await asyncio.sleep(1.0)
        fleet.removed.add(cid)
    fleet.operated.discard(cid)


async def _sample(fleet: Fleet, history: dict[str, list[tuple[float, int]]]) -> None:
    """Each connection's effective checkpoint as DynamoDB holds it, read from outside the workers:
    the newer of the item's `last_seq` and its holder's batched entry at the item's epoch (§2b)."""
    table = fleet.database.tables[TABLE]
    loop = asyncio.get_running_loop()
    while True:
        for cid, samples in history.items():
            item = table.items.get(cid)
            if item is None or "last_seq" not in item:
                continue
            owner = item.get("lease_owner", {}).get("S")
            holder = table.items.get(checkpoint_key(owner)["connection_id"]["S"]) if owner else None
            seq = effective_checkpoint(
                int(item["last_seq"]["N"]),
                int(item.get("lease_epoch", {}).get("N", "0")),
                cid,
                entries_from(holder) if holder else {},
            )
            if not samples or samples[-1][1] != seq:
                samples.append((loop.time(), seq))
        await asyncio.sleep(SAMPLE_SECONDS)
