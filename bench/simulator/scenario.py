"""One design's simulated run with the real workers: cold start, steady state, deaths, scale-out.

The fleet is `make sim`'s (bench/simulator/dst/world.py): the real `Worker`s and every loop they
run, on one virtual-time event loop, against the in-memory DynamoDB, each worker's calls priced
on its own meter by DynamoDB's rules. No decision is re-implemented here: the scenario only
starts, kills and watches workers, and reads the table and the sink from the outside.

Timeline (virtual seconds): the connections are added through `LeaseTableAdmin.add`; the workers
start (staggered within a second) and claim them cold; once every connection is owned and no
worker holds more than the fair share, a warm-up, then a steady window prices every worker's
calls; then `killed` workers die as a host does (no release, no hint; with `supervised`, their
supervisor fences each session as a confirmed death at once) and the connections owned by a live
worker are sampled until all are; then `added` workers join and the loads are sampled until the
fair share holds (max load <= ceil(N / W), all owned). At the end every worker shuts down in
order, and the sink's arrivals are judged: S1 and S2 (bench/simulator/dst/checks.py), and every
connection served since the fleet settled.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.designs import Design
from bench.simulator.clock import VirtualClock, run_virtual
from bench.simulator.dst import checks
from bench.simulator.dst.world import TABLE, Fleet, Timings
from bench.simulator.memory_dynamodb import MemoryDynamoDB
from leaseworker.lease.liveness import CONFIRMED
from leaseworker.lease.session_store import SessionStore
from leaseworker.lease.vocabulary import MAX_ENTRIES_PER_ITEM

SAMPLE_SECONDS = 0.5
LOOP_STEP_SECONDS = 1e-6  # as make sim's (clock.virtual_loop)


@dataclass(frozen=True)
class Size:
    name: str
    connections: int
    workers: int
    killed: int
    added: int
    period: float = 5.0  # each feed sends a message every `period` virtual seconds


SIZES = {
    "tiny": Size("tiny", 200, 5, 1, 1),
    # The per-worker loads of a 100,000 × 100 fleet (1,000, then 1,111 after 10 % die), at the
    # size the real workers run in about an hour of CPU for the four designs (docs/benchmarks.md).
    "full": Size("full", 10_000, 10, 1, 1),
}


def timings_of(design: Design) -> Timings:
    return Timings(
        lease_seconds=design.lease,
        heartbeat_seconds=design.heartbeat,
        reconcile_seconds=design.reconcile,
        checkpoint_seconds=design.checkpoint,
        max_clock_skew_ms=design.skew_ms,
    )


class Run:
    def __init__(self, design: Design, size: Size, seed: int) -> None:
        self.design = design
        self.size = size
        self.rng = random.Random(seed)
        share = math.ceil(size.connections / (size.workers - size.killed))
        self.fleet = Fleet(
            design.lease_mode,
            self.rng,
            size.connections,
            size.period,
            timings_of(design),
            # Room for the survivors' share after the deaths, within one checkpoint item.
            max_connections=min(MAX_ENTRIES_PER_ITEM, max(8, 2 * share)),
            # Ids as long as the earlier runs' (`feed-0000001`): session mode's checkpoint item,
            # one entry per connection, is priced by its size.
            id_prefix="feed-",
            id_digits=7,
        )
        self.samples = 0

    def owned(self) -> int:
        table = self.fleet.database.tables[TABLE]
        return sum(table.owned_by(w) for w in self.fleet.live())

    def loads(self) -> list[int]:
        table = self.fleet.database.tables[TABLE]
        return [table.owned_by(w) for w in self.fleet.live()]

    def balanced(self) -> bool:
        loads = self.loads()
        return sum(loads) >= self.size.connections and max(loads) <= math.ceil(
            self.size.connections / len(loads)
        )

    async def sample_until(
        self, done: Callable[[], bool], limit: float, start: float
    ) -> tuple[float | None, list[tuple[float, int]]]:
        loop = asyncio.get_running_loop()
        curve: list[tuple[float, int]] = []
        while loop.time() - start <= limit:
            curve.append((round(loop.time() - start, 3), self.owned()))
            self.samples += 1
            if done():
                return round(loop.time() - start, 3), curve
            await asyncio.sleep(SAMPLE_SECONDS)
        return None, curve

    def meters(self) -> dict[str, tuple[float, float]]:
        return {w: (sim.link.meter.rru, sim.link.meter.wru) for w, sim in self.fleet.workers.items()}

    def units_by_kind(self) -> Counter[str]:
        kinds = Counter[str]()
        for sim in self.fleet.workers.values():
            kinds.update(sim.link.meter.units)
        return kinds

    def moves_since(self, since: float, to: set[str]) -> tuple[int, int]:
        """Subscribes at a new epoch since `since` (each a move), and how many went to `to`."""
        moves = to_new = 0
        for feed in self.fleet.upstream.feeds.values():
            for at, _epoch, worker_id, _after in feed.subscribes:
                if at >= since:
                    moves += 1
                    to_new += worker_id in to
        return moves, to_new

    async def main(self, clock: VirtualClock) -> dict[str, Any]:
        size, design, fleet = self.size, self.design, self.fleet
        loop = asyncio.get_running_loop()
        await fleet.add_connections()
        started_at = loop.time()
        for _ in range(size.workers):
            fleet.start_worker()
            await asyncio.sleep(self.rng.uniform(0.0, 1.0 / size.workers))
        cold, _ = await self.sample_until(self.balanced, 30 * design.reconcile + design.lease, started_at)
        warmup = 2 * design.heartbeat + 1
        window = max(60.0, 2 * design.reconcile)
        await asyncio.sleep(warmup)
        before, kinds_before = self.meters(), self.units_by_kind()
        await asyncio.sleep(window)
        after, kinds = self.meters(), self.units_by_kind()
        kinds.subtract(kinds_before)
        rates = {k: ((r - before[k][0]) / window, (w - before[k][1]) / window) for k, (r, w) in after.items()}
        steady = _steady(rates, size.connections, window, kinds)

        # ---- deaths: a host loss (the lease path), or with `supervised` a fence at once
        victims = self.rng.sample(sorted(fleet.live()), size.killed)
        table = fleet.database.tables[TABLE]
        orphaned = sum(table.owned_by(v) for v in victims)
        killed_at = loop.time()
        for victim in victims:
            fleet.kill(victim)
        if design.supervised:
            supervisor = SessionStore(MemoryDynamoDB(fleet.database), TABLE)  # type: ignore[arg-type]
            for victim in victims:
                await supervisor.fence(
                    victim, seen_hb=None, me=f"supervisor-{victim}", kind=CONFIRMED, reason="exit"
                )
        limit = design.lease + 4 * design.reconcile + 60
        converged, curve = await self.sample_until(lambda: self.owned() >= size.connections, limit, killed_at)
        after_death = self.meters()
        # ---- scale-out, once the survivors are balanced (or after three reconciles)
        await self.sample_until(self.balanced, 3 * design.reconcile, loop.time())
        added_at = loop.time()
        new = {fleet.start_worker() for _ in range(size.added)}
        balanced_limit = min(600.0, 30 * design.reconcile)
        balanced, _ = await self.sample_until(self.balanced, balanced_limit, added_at)
        moves, to_new = self.moves_since(added_at, new)
        loads = self.loads()
        settled_at = loop.time()
        await asyncio.sleep(2 * size.period + design.checkpoint)
        served = checks.served(fleet.arrivals.log, fleet.ids, since=settled_at)
        for worker_id in fleet.live():  # an ordered shutdown of all
            fleet.terminate(worker_id)
        await asyncio.wait([w.task for w in fleet.workers.values()], timeout=60.0)
        log = fleet.arrivals.log
        violations = served + checks.one_deliverer(log) + checks.no_loss(log)
        ended = {w: sim.ended or "still running" for w, sim in fleet.workers.items()}
        violations += [f"worker {w} {why}" for w, why in ended.items() if why.startswith(("crash", "still"))]
        return {
            "design": design.name,
            "lease_mode": design.lease_mode,
            "note": design.note,
            "timings": {
                "lease": design.lease,
                "heartbeat": design.heartbeat,
                "reconcile": design.reconcile,
                "checkpoint": design.checkpoint,
                "skew_ms": design.skew_ms,
            },
            "max_connections": fleet.max_connections,
            "cold_start_seconds": cold,
            "steady": steady,
            "death": {
                "killed": size.killed,
                "connections_orphaned": orphaned,
                "convergence_seconds": converged,
                "curve": curve,
                "units_until_converged": _delta(after_death, after),
            },
            "scale_out": {
                "added": size.added,
                "moves": moves,
                "moves_to_new": to_new,
                "balanced_seconds": balanced,
                "limit_seconds": balanced_limit,
                "fair_share": math.ceil(size.connections / len(loads)),
                "max_load": max(loads),
                "min_load": min(loads),
            },
            "violations": dict(Counter(v.split(" ", 1)[0] for v in violations)),
            "first_violations": violations[:5],
            "delivered": len(log),
            "invariant_checks": {"arrivals judged": len(log), "samples": self.samples},
            "virtual_seconds": round(clock.now, 1),
        }


def _steady(
    rates: dict[str, tuple[float, float]], connections: int, window: float, kinds: Counter[str]
) -> dict[str, Any]:
    reads = [r for r, _ in rates.values()]
    writes = [w for _, w in rates.values()]
    total_wru = sum(writes)
    return {
        "window_seconds": window,
        "rru_per_worker_s": {"mean": sum(reads) / len(reads), "max": max(reads)},
        "wru_per_worker_s": {"mean": sum(writes) / len(writes), "max": max(writes)},
        "fleet_rru_s": sum(reads),
        "fleet_wru_s": total_wru,
        "wru_per_connection_hour": total_wru / connections * 3600,
        "rru_per_connection_hour": sum(reads) / connections * 3600,
        "units_per_s_by_kind": {k: round(v / window, 3) for k, v in sorted(kinds.items()) if v > 0},
    }


def _delta(
    later: dict[str, tuple[float, float]], earlier: dict[str, tuple[float, float]]
) -> dict[str, float]:
    return {
        "rru": sum(later[k][0] - earlier.get(k, (0.0, 0.0))[0] for k in later),
        "wru": sum(later[k][1] - earlier.get(k, (0.0, 0.0))[1] for k in later),
    }


def simulate(design: Design, size: Size, *, seed: int = 12) -> dict[str, Any]:
    random.seed(seed)  # the workers' own jitter draws from here (as make sim's)
    run = Run(design, size, seed)
    started = time.perf_counter()
    cpu = time.process_time()
    result = run_virtual(run.main, step=LOOP_STEP_SECONDS)
    result["wall_seconds"] = round(time.perf_counter() - started, 1)
    result["cpu_seconds"] = round(time.process_time() - cpu, 1)
    return result
