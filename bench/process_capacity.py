"""P5: what one worker process holds: connections, messages/s per core, RSS per connection.

One worker (`leaseworker run`: a supervisor and its worker child, docs/design.md §2e) on a local fleet
is ramped through the config's steps of connections on the local feed, each at `rate` msg/s. At
each step, once every connection is subscribed and a settle time has passed, a steady window
measures, from /proc: the worker child's CPU seconds (utime + stime) and RSS, the supervisor's
RSS, the feed's and DynamoDB Local's CPU; and, from the worker's EMF lines (one a second), the
messages it delivered. msgs/s per core is messages delivered / worker CPU seconds, so the feed and
DynamoDB Local sharing the machine's two cores do not count against the worker. The ramp's
per-connection rate is low, as most upstreams are (every message then arrives alone, one socket
read each); a second, dense run on a fresh fleet holds fewer connections at a high rate, where
frames arrive in bursts and batch. Both run once per sink (file, null).

The worker runs in connection mode with long periods (lease 600 s, heartbeat 150 s, checkpoint
300 s): session mode refuses MAX_CONNECTIONS above one checkpoint item's capacity
(lease/checkpoint_store.py, 2,534), and connection mode at the default 5 s heartbeat needs
N/5 renewals a second, 2,000/s at 10,000, beyond DynamoDB Local's ~600 conditional writes/s. With
these periods the per-connection DynamoDB writes (N/150 + N/300 per second) stay a small share of
the window; they are counted in the worker's CPU.

    .venv/bin/python -m bench.process_capacity --mode tiny|quick|full --out DIR
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench.probe import (
    FeedLog,
    MetricsLog,
    add_connections,
    capacity_cli,
    cpu_seconds,
    raise_open_files,
    rss_bytes,
    worker_child,
)
from leaseworker_dev.local.fleet import Fleet, Timings, poll_until

TIMINGS = Timings(
    lease_seconds=600.0,
    heartbeat_seconds=150.0,
    reconcile_seconds=2.0,
    checkpoint_seconds=300.0,
    max_clock_skew_ms=1000,
    metrics_seconds=1.0,
    shutdown_grace_seconds=10.0,
)
SINKS = ("file", "null")
TARGET_CONNECTIONS = 5000
TARGET_KB_PER_CONNECTION = 60.0
TARGET_MSGS_PER_CORE = 20_000.0
BUSY_CORE = 0.9  # a process using this much of a core is the bottleneck


@dataclass(frozen=True)
class Config:
    name: str
    steps: tuple[int, ...]  # the ramp: connections held, each at `rate` msg/s
    rate: float
    dense_connections: int  # then, on a fresh fleet: fewer connections at a higher rate
    dense_rate: float
    settle_s: float
    window_s: float
    subscribe_timeout_s: float = 240.0


TINY = Config("tiny", (5, 20), 5.0, 5, 100.0, settle_s=1.5, window_s=2.5, subscribe_timeout_s=60.0)
QUICK = Config("quick", (100, 1000, 2500), 1.0, 100, 150.0, settle_s=3.0, window_s=8.0)
FULL = Config("full", (100, 1000, 2500, 5000, 10000), 1.0, 200, 100.0, settle_s=5.0, window_s=20.0)
CONFIGS = {c.name: c for c in (TINY, QUICK, FULL)}


@dataclass
class _Pids:
    supervisor: int
    worker: int
    feed: int
    dynamodb: int

    def cpu(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) for name, pid in asdict(self).items()}


def run(mode: str) -> dict[str, Any]:
    config = CONFIGS[mode]
    raise_open_files(2 * max(config.steps) + 1024)
    return {
        "config": asdict(config),
        "lease_mode": "connection",
        "timings": asdict(TIMINGS),
        "sinks": {
            sink: _ramp(config, sink, config.steps, config.rate) | _dense(config, sink) for sink in SINKS
        },
    }


def _dense(config: Config, sink: str) -> dict[str, Any]:
    run = _ramp(config, sink, (config.dense_connections,), config.dense_rate)
    return {"dense": run["steps"][0] | {"baseline_rss_bytes": run["baseline_rss_bytes"]}}


def _ramp(config: Config, sink: str, plan: tuple[int, ...], rate: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"bench-p5-{sink}-") as root:
        fleet = Fleet(
            Path(root),
            timings=TIMINGS,
            feed_rate=rate,
            with_sqs=False,
            max_connections=max(plan),
            lease_mode="connection",
        )
        with fleet:
            assert fleet.dynamodb is not None and fleet.feed is not None
            spec = "null" if sink == "null" else f"file:{fleet.sink_dir}"
            supervisor = fleet.start_worker("p5", extra_env={"SINK": spec}).pid
            metrics = MetricsLog(fleet.logs / "p5.log")
            if not poll_until(lambda: bool(metrics.poll()) and worker_child(supervisor) != supervisor, 60):
                raise RuntimeError(f"the worker did not start; see {fleet.logs / 'p5.log'}")
            pids = _Pids(supervisor, worker_child(supervisor), fleet.feed.pid, fleet.dynamodb.pid)
            feed = FeedLog(fleet.feed_log)
            time.sleep(config.settle_s)
            baseline = rss_bytes(pids.worker)
            steps: list[dict[str, Any]] = []
            held = 0
            for target in plan:
                started = time.monotonic()
                add_connections(
                    fleet.endpoint,
                    [(f"p5-{i:05d}", fleet.url_for(f"p5-{i:05d}")) for i in range(held, target)],
                )
                added = time.monotonic()
                subscribed = poll_until(partial(_holds, feed, target), config.subscribe_timeout_s, 0.5)
                ready = time.monotonic()
                held = target
                time.sleep(config.settle_s)
                step = _window(
                    config,
                    rate=rate,
                    pids=pids,
                    metrics=metrics,
                    feed=feed,
                    connections=target,
                    baseline=baseline,
                    previous=steps,
                ) | {"add_s": added - started, "subscribe_s": ready - added, "all_subscribed": subscribed}
                if not subscribed:  # the worker could not take more within the timeout
                    step["bottleneck"] = f"claims stalled: {step['held_feed']:,} of {target:,} subscribed"
                steps.append(step)
            supervisor_rss = rss_bytes(pids.supervisor)
    return {"baseline_rss_bytes": baseline, "supervisor_rss_bytes": supervisor_rss, "steps": steps}


def _holds(feed: FeedLog, connections: int) -> bool:
    return feed.poll() >= connections


def _window(
    config: Config,
    *,
    rate: float,
    pids: _Pids,
    metrics: MetricsLog,
    feed: FeedLog,
    connections: int,
    baseline: int,
    previous: list[dict[str, Any]],
) -> dict[str, Any]:
    start_ms, cpu0, t0 = time.time_ns() // 1_000_000, pids.cpu(), time.monotonic()
    time.sleep(config.window_s)
    end_ms, cpu1, t1 = time.time_ns() // 1_000_000, pids.cpu(), time.monotonic()
    rss = rss_bytes(pids.worker)
    delivered, first_ms, last_ms = metrics.delivered_between(start_ms, end_ms)
    flushes = [f for f in metrics.flushes if f.t_ms <= end_ms]
    cores = {name: (cpu1[name] - cpu0[name]) / (t1 - t0) for name in cpu0}
    wall = delivered / ((last_ms - first_ms) / 1000) if last_ms > first_ms else 0.0
    offered = connections * rate
    held = feed.poll()
    return {
        "connections": connections,
        "held_feed": held,
        "held_worker": flushes[-1].held if flushes else None,
        "rss_bytes": rss,
        **rss_per_connection(rss, held, baseline, previous[-1] if previous else None),
        "offered_msgs_per_s": offered,
        "msgs_per_s_wall": wall,
        "delivered_fraction": wall / offered if offered else 0.0,
        "cores": cores,
        "msgs_per_cpu_s": wall / cores["worker"] if cores["worker"] > 0 else 0.0,
        "bottleneck": _bottleneck(cores, wall, offered),
    }


def rss_per_connection(
    rss: int, held: int, baseline: int, prior: dict[str, Any] | None
) -> dict[str, float | None]:
    """KB of the worker's RSS per connection held: in total, above the 0-connection baseline, and
    between this step and the one before (`prior`)."""
    before_rss, before_held = (baseline, 0) if prior is None else (prior["rss_bytes"], prior["held_feed"])
    return {
        "kb_per_connection": rss / held / 1024 if held else None,
        "marginal_kb_per_connection": (rss - baseline) / held / 1024 if held else None,
        "step_kb_per_connection": (
            (rss - before_rss) / (held - before_held) / 1024 if held > before_held else None
        ),
    }


def _bottleneck(cores: dict[str, float], wall: float, offered: float) -> str:
    busy = [name for name in ("worker", "feed") if cores[name] >= BUSY_CORE]
    if busy:
        return "+".join(busy)
    if wall >= 0.95 * offered:
        return "none (all offered load delivered)"
    if sum(cores.values()) >= 2 * BUSY_CORE:
        return "machine (2 cores shared)"
    return "unclear"


def section(results: dict[str, Any]) -> list[str]:
    from bench.capacity_report import p5_section

    return p5_section(results)


def main(argv: list[str] | None = None) -> int:
    return capacity_cli(
        argv,
        prog="python -m bench.process_capacity",
        description=__doc__,
        modes=CONFIGS,
        run=run,
        section=section,
        stem="p5",
        plot="rss_plot",
        plot_suffix="rss",
    )


if __name__ == "__main__":
    raise SystemExit(main())
