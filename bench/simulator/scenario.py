"""One design's simulated day: warm fleet, steady state, 10 % of workers die, 10 % more join.

Timeline (virtual seconds): the connections are added through the real `LeaseTableAdmin.add`
and claimed round-robin through the real `Ownership.claim` (a warm, balanced fleet); the loops
start; after a warm-up, a steady window prices every worker's calls; then `killed` workers stop
dead (a host loss: no release, no hint; with `supervised`, their supervisor fences each session
as a confirmed death at once) and the owned connections are sampled until all are owned again;
then `added` fresh workers join and the loads are sampled until the real fair-share rule holds
(max load <= ceil(N / W), all owned). Every sample also checks that no connection is held,
valid, by two live workers, and that every valid local lease matches the item's owner and epoch.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from bench.designs import Design
from bench.simulator import peers
from bench.simulator.clock import VirtualClock, run_virtual
from bench.simulator.memory_dynamodb import MemoryDynamoDB
from bench.simulator.memory_table import Database
from bench.simulator.worker import SimWorker
from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.liveness import CONFIRMED
from leaseworker.lease.session_store import SessionStore
from leaseworker.settings import Settings

TABLE = "leaseworker-sim"
SAMPLE_SECONDS = 0.5
CHECK_EVERY_SAMPLES = 10


@dataclass(frozen=True)
class Size:
    name: str
    connections: int
    workers: int
    killed: int
    added: int
    fidelity: str  # "exact": every call through the real stores; "batched": see bulk.py


SIZES = {
    "tiny": Size("tiny", 200, 5, 1, 1, "exact"),
    "full": Size("full", 100_000, 100, 10, 10, "batched"),
}


def settings_for(design: Design, size: Size, worker_id: str) -> Settings:
    share = math.ceil(size.connections / (size.workers - size.killed))
    return Settings(
        table_name=TABLE,
        lease_mode="session" if design.lease_mode == "session" else "connection",
        lease_seconds=design.lease,
        heartbeat_seconds=design.heartbeat,
        reconcile_seconds=design.reconcile,
        checkpoint_seconds=design.checkpoint,
        max_clock_skew_ms=design.skew_ms,
        # Room for the survivors' share after the deaths (1,112 at 100k/90), within session
        # mode's one-item checkpoint limit (2,534).
        max_connections=min(2534, max(1000, 2 * share)),
        worker_id=worker_id,
    )


class Run:
    def __init__(self, design: Design, size: Size, seed: int) -> None:
        self.design = design
        self.size = size
        self.rng = random.Random(seed)
        self.database = Database()
        self.database.create_table(TABLE)
        self.workers: dict[str, SimWorker] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.dead: set[str] = set()
        self.violations: Counter[str] = Counter()
        self.samples = 0

    def _new_worker(self, index: int) -> SimWorker:
        worker_id = f"w{index:04d}"
        worker = SimWorker(
            settings_for(self.design, self.size, worker_id),
            self.database,
            random.Random(self.rng.random()),
            fidelity=self.size.fidelity,
        )
        self.workers[worker_id] = worker
        return worker

    def _start(self, worker: SimWorker) -> None:
        self.tasks[worker.me] = asyncio.get_running_loop().create_task(worker.run())

    def live(self) -> list[SimWorker]:
        return [w for w in self.workers.values() if w.me not in self.dead and not w.fenced]

    def owned(self) -> int:
        table = self.database.tables[TABLE]
        return sum(table.owned_by(w.me) for w in self.live())

    def loads(self) -> list[int]:
        table = self.database.tables[TABLE]
        return [table.owned_by(w.me) for w in self.live()]

    def check(self) -> None:
        """S1 at this instant: one valid holder per connection, and it is the item's owner/epoch."""
        items = self.database.tables[TABLE].items
        seen: set[str] = set()
        for worker in self.live():
            for lease in worker.live_leases():
                cid = lease.connection_id
                if cid in seen:
                    self.violations["held by two live workers"] += 1
                seen.add(cid)
                item = items.get(cid, {})
                if item.get("lease_owner", {}).get("S") != lease.owner or item.get("lease_epoch", {}).get(
                    "N"
                ) != str(lease.epoch):
                    self.violations["valid local lease not the item's owner/epoch"] += 1

    async def sample_until(
        self, done: Any, limit: float, start: float
    ) -> tuple[float | None, list[tuple[float, int]]]:
        loop = asyncio.get_running_loop()
        curve: list[tuple[float, int]] = []
        while loop.time() - start <= limit:
            owned = self.owned()
            curve.append((round(loop.time() - start, 3), owned))
            self.samples += 1
            if self.samples % CHECK_EVERY_SAMPLES == 0:
                self.check()
            if done(owned):
                return loop.time() - start, curve
            await asyncio.sleep(SAMPLE_SECONDS)
        return None, curve

    def meters(self) -> dict[str, tuple[float, float]]:
        return {w.me: (w.meter.rru, w.meter.wru) for w in self.workers.values()}

    async def main(self, clock: VirtualClock) -> dict[str, Any]:
        size, design = self.size, self.design
        loop = asyncio.get_running_loop()
        admin = LeaseTableAdmin(MemoryDynamoDB(self.database), TABLE)  # type: ignore[arg-type]
        ids = [f"feed-{i:07d}" for i in range(size.connections)]
        for cid in ids:
            await admin.add(cid, f"wss://upstream.example/{cid}")
        fleet = [self._new_worker(i) for i in range(size.workers)]
        for worker in fleet:
            await worker.beat()
        for i, cid in enumerate(ids):
            await fleet[i % len(fleet)].claim(cid)
        for worker in fleet:
            self._start(worker)
        warmup = 2 * design.heartbeat + 1
        window = max(60.0, 2 * design.reconcile)
        await asyncio.sleep(warmup)
        before = self.meters()
        kinds_before = Counter[str]()
        for w in fleet:
            kinds_before.update(w.meter.units)
        await asyncio.sleep(window)
        after = self.meters()
        kinds = Counter[str]()
        for w in fleet:
            kinds.update(w.meter.units)
        kinds.subtract(kinds_before)
        rates = {
            k: ((after[k][0] - before[k][0]) / window, (after[k][1] - before[k][1]) / window) for k in after
        }
        steady = _steady(rates, size.connections, window, kinds)

        # ---- deaths
        victims = self.rng.sample(sorted(self.workers), size.killed)
        killed_at = loop.time()
        held_by_victims = sum(self.database.tables[TABLE].owned_by(v) for v in victims)
        for victim in victims:
            self.dead.add(victim)
            self.tasks[victim].cancel()
            self.workers[victim].peers.cancel()
        if design.supervised:
            supervisor = SessionStore(MemoryDynamoDB(self.database), TABLE)  # type: ignore[arg-type]
            for victim in victims:
                await supervisor.fence(
                    victim, seen_hb=None, me=f"supervisor-{victim}", kind=CONFIRMED, reason="exit"
                )
        await asyncio.sleep(0)
        limit = design.lease + 4 * design.reconcile + 60
        converged, curve = await self.sample_until(lambda owned: owned >= size.connections, limit, killed_at)
        meters_after_death = self.meters()
        # ---- scale-out, once the survivors are balanced (or after three reconciles)
        survivors = len(self.live())
        await self.sample_until(
            lambda _: max(self.loads()) <= math.ceil(size.connections / survivors),
            3 * design.reconcile,
            loop.time(),
        )
        claims_before = {w.me: w.claims for w in self.workers.values()}
        releases_before = sum(w.releases for w in self.workers.values())
        base = len(self.workers)
        for i in range(size.added):
            worker = self._new_worker(base + i)
            self._start(worker)
        added_at = loop.time()
        fleet_size = len(self.live())
        balanced_limit = min(600.0, 30 * design.reconcile)
        balanced, scale_curve = await self.sample_until(
            lambda owned: (
                owned >= size.connections and max(self.loads()) <= math.ceil(size.connections / fleet_size)
            ),
            balanced_limit,
            added_at,
        )
        self.check()
        loads = self.loads()
        moves = sum(w.claims - claims_before.get(w.me, 0) for w in self.workers.values())
        for worker_id, task in self.tasks.items():
            task.cancel()
            self.workers[worker_id].peers.cancel()  # takeover sweeps still waiting on a rank
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        takeover_units = _delta(meters_after_death, after)
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
            "max_connections": fleet[0].settings.max_connections,
            "steady": steady,
            "death": {
                "killed": size.killed,
                "connections_orphaned": held_by_victims,
                "convergence_seconds": converged,
                "curve": curve,
                "units_until_converged": takeover_units,
            },
            "scale_out": {
                "added": size.added,
                "moves": moves,
                "releases": sum(w.releases for w in self.workers.values()) - releases_before,
                "balanced_seconds": balanced,
                "limit_seconds": balanced_limit,
                "fair_share": math.ceil(size.connections / fleet_size),
                "max_load": max(loads),
                "min_load": min(loads),
                "curve_max_load": [(t, n) for t, n in scale_curve][-1:],
            },
            "violations": dict(self.violations),
            "invariant_checks": self.samples // CHECK_EVERY_SAMPLES + 1,
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
    peers._RANKS.clear()
    run = Run(design, size, seed)
    started = time.perf_counter()
    result = run_virtual(run.main)
    result["wall_seconds"] = round(time.perf_counter() - started, 1)
    result["fidelity"] = size.fidelity
    return result
