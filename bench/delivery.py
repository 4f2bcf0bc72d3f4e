"""P5's delivery path against its limit: one worker process, msgs/s per core, dense and sparse.

Issue 25 item 1. The same upstream as P8 (`bench.generic_vs_seqfeed`: one process on loopback, no
compression, a Jetstream-like generic/1 feed), and two kinds of consumer process, each fresh:

- `bare`: the limit. N websockets connections (the pinned websockets, the same client settings
  as the worker's: no compression), each a receive loop that counts what it gets and discards it.
  No lease, no protocol, no sink.
- `worker`: N real ConnectionSessions (worker/session.py + worker/socket_run.py, the generic/1
  adapter, the file sink, batching and checkpoint bookkeeping), on leases that do not lapse (no
  DynamoDB: its writes are P3's subject, and at P5's periods they are a small share of the CPU).

Traffic: dense = `dense_connections` at `dense_rate` msg/s each (P5's 200 x 100/s); sparse =
`sparse_connections` at `sparse_rate` (one frame per socket read, as most upstreams send).
msgs/s per core = messages counted (bare) or acknowledged by the sink (worker) in the window /
the consumer's own CPU seconds (utime + stime from /proc). The ratio worker / bare is the figure
the issue judges (goal >= 0.6 dense and sparse).

Candidates are measured each on its own, in the same run, against the same baseline:
`--loop uvloop` (the event loop), and `--code DIR` (a checkout of other code, e.g. before a
change: its worker_src goes first on the consumer's sys.path).

    .venv/bin/python -m bench.delivery --mode tiny|quick|full [--candidates uvloop] [--before DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from bench.probe import cpu_seconds, raise_open_files

REPO: Final = Path(__file__).resolve().parents[1]
TARGET_RATIO: Final = 0.6


@dataclass(frozen=True)
class Config:
    name: str
    dense_connections: int
    dense_rate: float
    sparse_connections: int
    sparse_rate: float
    settle_s: float
    window_s: float
    repeats: int
    connect_timeout_s: float = 180.0


TINY = Config("tiny", 5, 100.0, 50, 2.0, settle_s=1.0, window_s=2.0, repeats=1)
QUICK = Config("quick", 200, 100.0, 2000, 2.5, settle_s=3.0, window_s=8.0, repeats=2)
FULL = Config("full", 200, 100.0, 5000, 1.0, settle_s=5.0, window_s=15.0, repeats=3)
CONFIGS: Final = {c.name: c for c in (TINY, QUICK, FULL)}


# ----------------------------------------------------------------------------- consumers


class _Bare:
    """N plain websockets receive loops: the limit the worker is measured against."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.count = 0
        self.tasks: list[asyncio.Task[None]] = []
        self.started = 0

    async def _one(self, index: int, rate: float) -> None:
        from websockets.asyncio.client import connect

        from leaseworker.worker.upstream import MAX_QUEUE_FRAMES

        url = f"{self.base_url}/generic/p5-bare-{index:05d}?rate={rate:g}"
        # The worker's receive settings (worker/upstream.py), so only the work after recv differs.
        async with connect(url, compression=None, max_size=2**20, max_queue=MAX_QUEUE_FRAMES) as ws:
            self.started += 1
            async for _ in ws:
                self.count += 1

    async def hold(self, target: int, rate: float, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for start in range(0, target, 100):
            for index in range(start, min(target, start + 100)):
                self.tasks.append(asyncio.create_task(self._one(index, rate)))
            while self.started < len(self.tasks):
                if time.monotonic() > deadline or any(t.done() for t in self.tasks):
                    return False
                await asyncio.sleep(0.05)
        return True

    def delivered(self) -> int:
        return self.count

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def _consumer_main(args: argparse.Namespace) -> dict[str, Any]:
    raise_open_files(2 * args.connections + 1024)
    if args.max_queue is not None:  # a candidate: the receive queue's high-water mark
        from leaseworker.worker import upstream as worker_upstream

        worker_upstream.MAX_QUEUE_FRAMES = args.max_queue  # type: ignore[misc]
    if args.kind == "bare":
        held: Any = _Bare(args.url)
    else:
        from bench.generic_vs_seqfeed import _Held
        from leaseworker.sinks.file import FileSink

        sink = FileSink(Path(args.sink_dir), "p5")
        held = _Held("generic", args.url, sink=sink, idle_timeout_s=args.idle_timeout)
        held.warm()
    ok = await held.hold(args.connections, args.rate, args.connect_timeout)
    await asyncio.sleep(args.settle)
    pid = os.getpid()
    n0, cpu0, t0 = held.delivered(), cpu_seconds(pid), time.monotonic()
    up0 = cpu_seconds(args.upstream_pid)
    profiler = None
    if args.profile_out:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    await asyncio.sleep(args.window)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile_out)
    n1, cpu1, t1 = held.delivered(), cpu_seconds(pid), time.monotonic()
    up1 = cpu_seconds(args.upstream_pid)
    await held.stop()
    wall, cpu = t1 - t0, cpu1 - cpu0
    return {
        "all_connected": ok,
        "messages": n1 - n0,
        "msgs_per_s_wall": (n1 - n0) / wall,
        "worker_cores": cpu / wall,
        "upstream_cores": (up1 - up0) / wall,
        "msgs_per_cpu_s": (n1 - n0) / cpu if cpu > 0 else 0.0,
    }


def _consumer_entry(args: argparse.Namespace) -> None:
    if args.loop == "uvloop":  # a candidate only: uvloop is in no requirements file (docs/benchmarks.md)
        import importlib

        uvloop: Any = importlib.import_module("uvloop")
        result = uvloop.run(_consumer_main(args))
    else:
        result = asyncio.run(_consumer_main(args))
    print(json.dumps(result), flush=True)


# ----------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Variant:
    name: str
    kind: str  # bare | worker
    loop: str = "asyncio"
    code: str | None = None  # another checkout's root: its worker_src first on sys.path
    max_queue: int | None = None  # worker/upstream.py MAX_QUEUE_FRAMES (None: as shipped)


def _measure(
    variant: Variant, url: str, upstream_pid: int, *, n: int, rate: float, config: Config, idle: float | None
) -> dict[str, Any]:
    env = dict(os.environ)
    if variant.code is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(variant.code) / "worker_src"), str(REPO)])
    with tempfile.TemporaryDirectory(prefix="bench-delivery-") as sink_dir:
        command = [
            sys.executable, "-m", "bench.delivery", "consume",
            "--kind", variant.kind, "--loop", variant.loop, "--url", url,
            "--upstream-pid", str(upstream_pid), "--connections", str(n), "--rate", str(rate),
            "--settle", str(config.settle_s), "--window", str(config.window_s),
            "--connect-timeout", str(config.connect_timeout_s), "--sink-dir", sink_dir,
            *(["--idle-timeout", str(idle)] if idle is not None else []),
            *(["--max-queue", str(variant.max_queue)] if variant.max_queue is not None else []),
        ]  # fmt: skip
        limit = config.connect_timeout_s + config.settle_s + config.window_s + 60
        done = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, timeout=limit, check=False
        )
    if done.returncode != 0:
        raise RuntimeError(f"{variant.name} failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(mode: str, variants: list[Variant], idle: float | None, repeats: int | None = None) -> dict[str, Any]:
    from dataclasses import replace

    from bench.generic_vs_seqfeed import upstream

    config = CONFIGS[mode] if repeats is None else replace(CONFIGS[mode], repeats=repeats)
    raise_open_files(2 * config.sparse_connections + 1024)
    traffic = {
        "dense": (config.dense_connections, config.dense_rate),
        "sparse": (config.sparse_connections, config.sparse_rate),
    }
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {t: {v.name: [] for v in variants} for t in traffic}
    with upstream() as (url, pid):
        for repeat in range(config.repeats):
            order = variants if repeat % 2 == 0 else list(reversed(variants))
            for name, (n, rate) in traffic.items():
                for variant in order:
                    result = _measure(variant, url, pid, n=n, rate=rate, config=config, idle=idle)
                    runs[name][variant.name].append(result)
                    print(
                        f"{name:6} {variant.name:24} {result['msgs_per_cpu_s']:>9,.0f} msgs/s per core "
                        f"({result['msgs_per_s_wall']:,.0f}/s on {result['worker_cores']:.2f} cores; "
                        f"upstream {result['upstream_cores']:.2f})",
                        file=sys.stderr,
                        flush=True,
                    )
    medians = {
        t: {v: statistics.median(r["msgs_per_cpu_s"] for r in results) for v, results in by_variant.items()}
        for t, by_variant in runs.items()
    }
    return {
        "config": asdict(config),
        "variants": [asdict(v) for v in variants],
        "runs": runs,
        "medians": medians,
    }


def section(results: dict[str, Any]) -> list[str]:
    medians = results["medians"]
    names = [v["name"] for v in results["variants"]]
    lines = [
        "| variant | dense msgs/s per core | vs bare | sparse msgs/s per core | vs bare |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in names:
        row = [name]
        for traffic in ("dense", "sparse"):
            value, bare = medians[traffic][name], medians[traffic]["bare"]
            row += [f"{value:,.0f}", f"{value / bare:.2f}"]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.delivery", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    consume = sub.add_parser("consume")
    consume.add_argument("--kind", choices=("bare", "worker"), required=True)
    consume.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    consume.add_argument("--url", required=True)
    consume.add_argument("--upstream-pid", type=int, required=True)
    consume.add_argument("--connections", type=int, required=True)
    consume.add_argument("--rate", type=float, required=True)
    consume.add_argument("--settle", type=float, required=True)
    consume.add_argument("--window", type=float, required=True)
    consume.add_argument("--connect-timeout", type=float, required=True)
    consume.add_argument("--sink-dir", required=True)
    consume.add_argument("--profile-out", help="cProfile the window into this file")
    consume.add_argument("--idle-timeout", type=float, help="the generic/1 config's keepalive.idle_timeout_s")
    consume.add_argument("--max-queue", type=int, help="worker/upstream.py MAX_QUEUE_FRAMES for this run")
    parser.add_argument("--mode", choices=sorted(CONFIGS), default="quick")
    parser.add_argument("--candidates", default="", help="comma-separated: uvloop, max-queue-N, bare-uvloop")
    parser.add_argument("--before", help="a checkout of the code to compare with (its root)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--repeats", type=int, help="runs per variant and traffic (the mode's by default)")
    parser.add_argument(
        "--feed",
        choices=("jetstream", "coinbase"),
        default="coinbase",
        help="jetstream: no adapter timer; coinbase: an idle timer of 10 s, as its preset has",
    )
    args = parser.parse_args(argv)
    if args.command == "consume":
        _consumer_entry(args)
        return 0
    variants = [Variant("bare", "bare"), Variant("worker", "worker")]
    if args.before:
        variants.append(Variant("worker (before)", "worker", code=args.before))
    for candidate in filter(None, args.candidates.split(",")):
        if candidate == "uvloop":
            variants.append(Variant("worker + uvloop", "worker", loop="uvloop"))
        elif candidate.startswith("max-queue-"):
            size = int(candidate.removeprefix("max-queue-"))
            variants.append(Variant(f"worker, max_queue {size}", "worker", max_queue=size))
        elif candidate == "bare-uvloop":
            variants.append(Variant("bare + uvloop", "bare", loop="uvloop"))
        else:
            parser.error(f"unknown candidate {candidate!r}")
    results = run(args.mode, variants, 10.0 if args.feed == "coinbase" else None, args.repeats)
    print("\n".join(section(results)))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "p5-delivery.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
