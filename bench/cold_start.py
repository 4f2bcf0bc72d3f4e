"""P6: cold start: how long until N new connections are all owned and subscribed.

N free connections are added to a fresh local fleet (nothing owned, no checkpoints), then the
workers are started together at production timings (lease 20 s, heartbeat 5 s, reconcile 5 s,
checkpoint 5 s; bench/designs.py at scale 1). The clock runs from the start of the first worker
until the feed's session log shows every connection subscribed at once (a subscribe follows its
claim by one connect; a lease lost closes its subscription). The feed sends nothing (rate 0), so
checkpoints do not compete with claims. Leases lost on the way show as subscribes beyond N.

Each claim is one conditional write. Before the workers start, each row measures what DynamoDB
Local serves of those on this machine at that moment (bench/write_ceiling.py: four processes of
bare claim-shaped conditional updates, no contention), on the row's own server; the ideal is
N / that ceiling, and claims per second are reported against it. Each worker's claims lost to a
peer (LeaseContention) and won (LeasesAcquired) are summed from its metrics, flushed every
METRICS_SECONDS (2 s here), up to the moment all were subscribed.
Session mode caps MAX_CONNECTIONS at one checkpoint item's capacity (MAX_ENTRIES_PER_ITEM, 1,117),
so 3 session-mode workers can own at most 7,602 connections: that row waits for as many as they can
own, and a row with enough workers for all N is added.

    .venv/bin/python -m bench.cold_start --mode tiny|quick|full|target --out DIR
    (`target`: only the 10,000-connection, 4-worker session row: issue 25's P6 target)
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import write_ceiling
from bench.designs import CONNECTION, SESSION
from bench.probe import FeedLog, add_connections, capacity_cli, cpu_seconds, owners, raise_open_files
from leaseworker.lease.vocabulary import MAX_ENTRIES_PER_ITEM
from leaseworker.supervisor.process import child_pids
from leaseworker_dev.local.fleet import Fleet, poll_until

CEILING_WRITES_PER_S = 600.0  # the timeout's estimate only; each row measures its own ceiling
CEILING_ITEMS = 4000  # claim-shaped writes per ceiling measurement (about 7 s at 600/s)
HEADROOM = 1.5  # MAX_CONNECTIONS = fair share × this, so the share, not the cap, decides


@dataclass(frozen=True)
class Row:
    lease_mode: str
    workers: int


@dataclass(frozen=True)
class Config:
    name: str
    connections: int
    rows: tuple[Row, ...]


def _rows(connections: int) -> tuple[Row, ...]:
    rows = [Row("connection", 3), Row("session", 3)]
    if connections > 3 * MAX_ENTRIES_PER_ITEM:
        rows.append(Row("session", math.ceil(connections / MAX_ENTRIES_PER_ITEM)))
    return tuple(rows)


CONFIGS = {
    c.name: c
    for c in (
        Config("tiny", 30, _rows(30)),
        Config("quick", 2000, _rows(2000)),
        Config("full", 10_000, _rows(10_000)),
        Config("target", 10_000, (Row("session", math.ceil(10_000 / MAX_ENTRIES_PER_ITEM)),)),
    )
}


def run(mode: str) -> dict[str, Any]:
    config = CONFIGS[mode]
    raise_open_files(2 * config.connections + 1024)
    return {
        "config": {"name": config.name, "connections": config.connections},
        "ceiling_writes_per_s": CEILING_WRITES_PER_S,
        "rows": [_cold_start(config.connections, row) for row in config.rows],
    }


def _cold_start(connections: int, row: Row) -> dict[str, Any]:
    design = CONNECTION if row.lease_mode == "connection" else SESSION
    cap = math.ceil(connections / row.workers * HEADROOM)
    if row.lease_mode == "session":
        cap = min(cap, MAX_ENTRIES_PER_ITEM)
    expected = min(connections, cap * row.workers)
    timings = dataclasses.replace(design.timings(1.0), metrics_seconds=2.0)
    with tempfile.TemporaryDirectory(prefix=f"bench-p6-{row.lease_mode}-") as root:
        fleet = Fleet(
            Path(root),
            timings=timings,
            feed_rate=0.0,
            with_sqs=design.sqs,
            max_connections=cap,
            sink="null",
            lease_mode=row.lease_mode,
        )
        with fleet:
            ids = [f"p6-{i:05d}" for i in range(connections)]
            add_connections(fleet.endpoint, [(cid, fleet.url_for(cid)) for cid in ids])
            items = min(CEILING_ITEMS, max(300, connections))
            assert fleet.dynamodb is not None and fleet.feed is not None
            services = {"dynamodb_local": fleet.dynamodb.pid, "feed": fleet.feed.pid}
            before_ceiling = {name: cpu_seconds(pid) for name, pid in services.items()}
            ceiling = write_ceiling.measure(fleet.endpoint, items, processes=row.workers)
            at_start = {name: cpu_seconds(pid) for name, pid in services.items()}
            ceiling["dynamodb_local_cpu_ms_per_write"] = (
                1000 * (at_start["dynamodb_local"] - before_ceiling["dynamodb_local"]) / max(1, items)
            )
            feed = FeedLog(fleet.feed_log)
            started_ms = time.time_ns() // 1_000_000
            for n in range(row.workers):
                fleet.start_worker(f"c{n}")
            timeout = 120 + 4 * expected / CEILING_WRITES_PER_S

            timeline: list[tuple[float, int]] = []  # (s since the start, subscriptions open)

            def all_subscribed() -> bool:
                timeline.append((time.time() - started_ms / 1000, feed.poll()))
                return timeline[-1][1] >= expected

            done = poll_until(all_subscribed, timeout, 0.5)
            all_ms = time.time_ns() // 1_000_000
            cpu = {name: cpu_seconds(pid) - at_start[name] for name, pid in services.items()}
            cpu["workers"] = sum(
                cpu_seconds(pid)
                for worker in fleet.workers.values()
                for pid in (worker.pid, *child_pids(worker.pid))
            )
            held = owners(fleet.endpoint)
        claims = _claim_metrics(fleet.logs, until_ms=all_ms + 2500)
    offsets = sorted((t - started_ms) / 1000 for t in feed.first_subscribed_ms.values())
    spread: dict[str, int] = {}
    for owner in held.values():
        if owner is not None:
            spread[owner] = spread.get(owner, 0) + 1
    all_s = timeline[-1][0] if done else None  # None: never all at once within the timeout
    first_s = offsets[0] if offsets else None
    ceiling_per_s = ceiling["writes_per_s"] or CEILING_WRITES_PER_S
    ideal_s = expected / ceiling_per_s
    return {
        "lease_mode": row.lease_mode,
        "workers": row.workers,
        "max_connections": cap,
        "connections": connections,
        "expected_owned": expected,
        "all_subscribed": done,
        "subscribed": len(offsets),  # ids subscribed at least once
        "open_at_end": timeline[-1][1] if timeline else 0,
        "most_open": max((n for _, n in timeline), default=0),
        "subscribes": feed.subscribes,
        "owned_at_end": sum(spread.values()),
        "spread": dict(sorted(spread.items())),
        "first_subscribe_s": first_s,
        "p50_s": _quantile(offsets, 0.5),
        "p90_s": _quantile(offsets, 0.9),
        "all_s": all_s,
        "claims_per_s": expected / all_s if all_s else None,
        "ceiling": ceiling,
        "ceiling_writes_per_s": ceiling_per_s,
        "of_ceiling": expected / all_s / ceiling_per_s if all_s else None,
        "claim_metrics": claims,
        # CPU seconds from the workers' start to all subscribed (the workers': their whole life,
        # start included), and per claim: what the machine spent besides DynamoDB Local's write.
        "cpu_seconds": cpu,
        "cpu_ms_per_claim": {name: 1000 * seconds / max(1, expected) for name, seconds in cpu.items()},
        "claims_per_s_after_first": (
            (expected - 1) / (all_s - first_s) if all_s and first_s is not None and all_s > first_s else None
        ),
        "ideal_s": ideal_s,
        "vs_ideal": all_s / ideal_s if all_s else None,
        "curve": [offsets[int(i * (len(offsets) - 1) / 100)] for i in range(101)] if offsets else [],
        "timings_real": {"lease": design.lease, "heartbeat": design.heartbeat, "reconcile": design.reconcile},
    }


def _claim_metrics(logs: Path, *, until_ms: int) -> dict[str, dict[str, float]]:
    """Per worker: LeasesAcquired and LeaseContention from its EMF lines flushed before `until_ms`
    (the first flush after all were subscribed is counted: a flush holds the 2 s before it)."""
    found: dict[str, dict[str, float]] = {}
    for path in sorted(logs.glob("c*.log")):
        sums = found.setdefault(path.stem, {"LeasesAcquired": 0.0, "LeaseContention": 0.0})
        for text in path.read_text(errors="replace").splitlines():
            if not text.startswith('{"_aws"'):
                continue
            line = json.loads(text)
            if int(line["_aws"]["Timestamp"]) > until_ms:
                continue
            for name in sums:
                value = line.get(name)
                sums[name] += sum(value) if isinstance(value, list) else float(value or 0)
    return found


def _quantile(values: list[float], q: float) -> float | None:
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def section(results: dict[str, Any]) -> list[str]:
    from bench.capacity_report import p6_section

    return p6_section(results)


def main(argv: list[str] | None = None) -> int:
    return capacity_cli(
        argv,
        prog="python -m bench.cold_start",
        description=__doc__,
        modes=CONFIGS,
        run=run,
        section=section,
        stem="p6",
        plot="cold_start_plot",
        plot_suffix="cold-start",
    )


if __name__ == "__main__":
    raise SystemExit(main())
