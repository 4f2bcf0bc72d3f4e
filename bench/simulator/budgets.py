"""Connect pacing at scale (issue 24): the reconnects after worker deaths, with and without the
fleet's connect budgets, in virtual time.

`python -m bench.simulator.budgets --out DIR`: budgets.json and a table.

The fleet: CONNECTIONS over HOSTS upstream hosts (`host_of`), WORKERS workers owning them
round-robin; KILLED workers die, and their connections (about CONNECTIONS x KILLED /
WORKERS, spread evenly over the hosts) are owned again by random survivors at virtual t = 0: the
lease bound (L1 without budgets) is the simulator's other half (bench/simulator/scenario.py)
and is not repeated here. Each must then connect again.

What is real: the budget code, `ConnectBudgets` and `BudgetStore`, one per worker, on the
simulator's in-memory DynamoDB (one table, the `budget#<host>` items, conditional writes) and its
virtual clock; and the session's reconnect backoff (`worker.backoff.backoff`, with jitter).
What is modelled: each upstream host counts connects as the local replays do
(feed/replays/limits.ConnectLimit: at most `count` per sliding `seconds`, then 429, and a 418 ban
of `ban_seconds` after `ban_after` refusals); a ban drops every connection the fleet holds to that
host (the issue's failure: "then every connection on that host is down"); a connect takes
CONNECT_S. Without budgets a refused session only backs off (0.2 s doubling to 30 s, jittered).

Converged: every connection connected, none waiting. The run stops at HORIZON_S.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.simulator.clock import VirtualClock, run_virtual
from bench.simulator.memory_dynamodb import MemoryDynamoDB
from bench.simulator.memory_table import Database
from leaseworker.lease.budget_store import BudgetStore, paced_seconds
from leaseworker.observability.metrics import WorkerMetrics
from leaseworker.worker.backoff import backoff
from leaseworker.worker.budget import URGENT, ConnectBudgets, Limit
from leaseworker_dev.feed.replays.limits import ConnectLimit, peak_in_window

TABLE = "leaseworker-sim"
CONNECTIONS, HOSTS, WORKERS, KILLED = 100_000, 100, 100, 10
CONNECT_S = 0.1  # TCP + TLS + upgrade
HORIZON_S = 1800.0

# Upstream limits per host: the published ones (docs/feeds.md); the ban rule is our model.
PROFILES = {
    "binance": {"count": 300, "seconds": 300.0, "ban_after": 10, "ban_seconds": 120.0},
    "coinbase": {"count": 8, "seconds": 1.0, "ban_after": 10, "ban_seconds": 120.0},
}


@dataclass
class Host:
    name: str
    limit: ConnectLimit
    connected: set[int] = field(default_factory=set)
    opens_ms: list[int] = field(default_factory=list)
    refusals: dict[int, int] = field(default_factory=lambda: {429: 0, 418: 0})
    bans: int = 0
    banned_until: float = -1.0  # the last ban's end seen, to count each ban once


@dataclass
class World:
    clock: VirtualClock
    hosts: list[Host]
    budgets: list[ConnectBudgets | None]
    waiting: set[int] = field(default_factory=set)
    converged_at: float | None = None
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    sessions: dict[int, asyncio.Task[None]] = field(default_factory=dict)


def host_of(cid: int) -> int:
    """Hosts cut across owners (owner = cid mod WORKERS): a dead worker held every host's share."""
    return (cid // WORKERS) % HOSTS


async def _connect(world: World, cid: int, worker: int, seed: int) -> None:
    """One session's connect attempts until it is connected (the real backoff between them)."""
    host = world.hosts[host_of(cid)]
    limit = Limit(host.name, host.limit.count, host.limit.seconds)
    budgets = world.budgets[worker]
    delays = backoff(rand=random.Random(seed * 1_000_003 + cid).random)
    while True:
        if budgets is not None:
            await budgets.acquire(limit, URGENT)
        await asyncio.sleep(CONNECT_S)
        now = world.clock.monotonic()
        refusal = host.limit.admit(now)
        if refusal is None:
            host.opens_ms.append(round(now * 1000))
            host.connected.add(cid)
            world.waiting.discard(cid)
            if not world.waiting:
                world.converged_at = now
                world.wakeup.set()
            return
        status = refusal.status_code
        host.refusals[status] += 1
        if status == 418 and host.limit.banned_until != host.banned_until:
            host.banned_until = host.limit.banned_until  # a new ban starts now
            host.bans += 1
            _drop_all(world, host, worker, seed)
        if budgets is not None:
            await budgets.refused(limit, status, float(refusal.headers["Retry-After"]))
        await asyncio.sleep(next(delays))


def _drop_all(world: World, host: Host, worker: int, seed: int) -> None:
    """A ban: the upstream drops every connection of the fleet to this host."""
    for cid in list(host.connected):
        host.connected.discard(cid)
        _start(world, cid, worker, seed)


def _start(world: World, cid: int, worker: int, seed: int) -> None:
    world.waiting.add(cid)
    world.converged_at = None
    task = world.sessions.get(cid)
    if task is None or task.done():
        world.sessions[cid] = asyncio.ensure_future(_connect(world, cid, worker, seed))


async def _simulate(
    clock: VirtualClock, profile: dict[str, Any], budgeted: bool, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    database = Database()
    database.create_table(TABLE)
    hosts = [Host(f"host-{h:03d}:443", ConnectLimit(**profile)) for h in range(HOSTS)]
    metrics = WorkerMetrics(namespace="Sim")
    clients = [MemoryDynamoDB(database) for _ in range(WORKERS)]
    world = World(
        clock,
        hosts,
        [
            ConnectBudgets(BudgetStore(client, TABLE), metrics, clock=clock.monotonic) if budgeted else None  # type: ignore[arg-type]
            for client in clients
        ],
    )
    # The steady state: every connection up, its connects long past every window.
    for cid in range(CONNECTIONS):
        hosts[host_of(cid)].connected.add(cid)
    survivors = list(range(KILLED, WORKERS))
    lost = [cid for cid in range(CONNECTIONS) if cid % WORKERS < KILLED]
    for cid in lost:
        hosts[host_of(cid)].connected.discard(cid)
        _start(world, cid, rng.choice(survivors), seed)
    try:
        async with asyncio.timeout(HORIZON_S):
            while world.converged_at is None:
                world.wakeup.clear()
                await world.wakeup.wait()
    except TimeoutError:
        pass
    for task in world.sessions.values():
        task.cancel()
    await asyncio.gather(*world.sessions.values(), return_exceptions=True)
    for b in world.budgets:
        if b is not None:
            await b.close()
    writes = sum(c.meter.wru for c in clients)
    reads = sum(c.meter.rru for c in clients)
    connects = sum(len(h.opens_ms) for h in hosts)
    per_host = len(lost) // HOSTS
    return {
        "converged_s": None if world.converged_at is None else round(world.converged_at, 2),
        "still_down": len(world.waiting),
        "connects": connects,
        "refused_429": sum(h.refusals[429] for h in hosts),
        "refused_418": sum(h.refusals[418] for h in hosts),
        "bans": sum(h.bans for h in hosts),
        "peak_per_window": max(peak_in_window(h.opens_ms, h.limit.seconds) for h in hosts),
        "limit": f"{profile['count']}/{profile['seconds']:g}s",
        "predicted_paced_s": round(paced_seconds(per_host, profile["count"], profile["seconds"]), 2),
        "budget_wru_per_connect": round(writes / connects, 4) if budgeted and connects else 0.0,
        "budget_rru_per_connect": round(reads / connects, 4) if budgeted and connects else 0.0,
    }


def simulate(profile: str, budgeted: bool, seed: int = 12) -> dict[str, Any]:
    """now_ms() and the pump's clock read the virtual clock (leaseworker.clock, run_virtual)."""

    async def main(clock: VirtualClock) -> dict[str, Any]:
        return await _simulate(clock, PROFILES[profile], budgeted, seed)

    return run_virtual(main)


def table(results: dict[str, dict[str, Any]]) -> str:
    rows = [
        "| upstream limit | budget | converged | connects | 429 | 418 | bans | peak/window | WRU/connect |"
    ]
    rows.append("|---|---|---|---|---|---|---|---|---|")
    for name, result in results.items():
        converged = result["converged_s"]
        shown = (
            f"{converged:.1f} s"
            if converged is not None
            else f"not in {HORIZON_S:g} s ({result['still_down']} down)"
        )
        rows.append(
            f"| {result['limit']} | {name.split('/')[1]} | {shown} | {result['connects']} | "
            f"{result['refused_429']} | {result['refused_418']} | {result['bans']} | "
            f"{result['peak_per_window']} | {result['budget_wru_per_connect']} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.simulator.budgets")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--profile", choices=sorted(PROFILES), action="append")
    parser.add_argument("--horizon", type=float, default=HORIZON_S, help="virtual seconds before giving up")
    args = parser.parse_args()
    globals()["HORIZON_S"] = args.horizon
    results: dict[str, dict[str, Any]] = {}
    for profile in args.profile or sorted(PROFILES):
        for budgeted in (True, False):
            results[f"{profile}/{'budget' if budgeted else 'none'}"] = simulate(profile, budgeted, args.seed)
            print(
                f"{profile} budget={budgeted}: {results[f'{profile}/' + ('budget' if budgeted else 'none')]}",
                flush=True,
            )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "budgets.json").write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
