"""P8: generic/1 against seqfeed/1 in one worker process: messages/s per core and RSS per connection.

Both protocols in ONE run, on the same machine, the same null sink and the same message payloads,
through the real session path (worker/session.py ConnectionSession + worker/socket_run.py: the
session performs the protocol's Sans-I/O actions). Only the protocol differs:

- seqfeed/1: the subscribe frame, then `{"type":"data","seq":n,"data":PAYLOAD}`;
- generic/1 (docs/design.md §4.2), as a Jetstream-like feed: `{"type":"data","payload":PAYLOAD}` with
  `frames.unwrap = /payload`, `cursor.path = /time_us`, `order = monotonic`, resume in the URL,
  and a classify rule ignoring `{"type":"heartbeat"}` (one heartbeat frame per
  HEARTBEAT_EVERY data frames, so the rule both matches and misses).

PAYLOAD is the same JSON text for both (`time_us`, `n`, the id and a post-like body); each side's
records carry the same `data`. The upstream (`upstream` below, one process on loopback, no
compression) serves both paths with the same send loop, either at full speed (rate 0: as fast as
TCP flow control lets it) or at `rate` msg/s per connection.

Each measurement is a fresh worker process (`worker` below) holding N ConnectionSessions, all
HELD on local leases that do not lapse (no DynamoDB: lease renewals and checkpoints are the same
for both protocols and are P5's subject, not this one's):

- throughput: N connections at full speed; after every connection has delivered and a settle
  time, a window measures messages the sink acknowledged (each session's `delivered_seq`) and
  the worker's own CPU seconds (utime + stime from /proc, as P5): msgs/s per core = messages /
  CPU seconds. Repeated with the protocols' order alternating; the median per protocol counts.
- memory: the worker's RSS (from /proc) after its imports and one protocol build (baseline), then
  at each step of idle-ish connections (`idle_rate` msg/s each): KB per connection above the
  baseline, and between the steps (the marginal cost of one more connection, which is the
  figure the target judges).

Targets (issue 21 item 10): generic/1 >= 0.8x seqfeed/1's msgs/s per core; memory per
connection within 10 %.

    .venv/bin/python -m bench.generic_vs_seqfeed --mode tiny|quick|full [--out DIR]
    .venv/bin/python -m bench.generic_vs_seqfeed --profile generic   # cProfile of one window
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

from bench.probe import cpu_seconds, raise_open_files, rss_bytes

PROTOCOLS: Final = ("seqfeed", "generic")
T0_US: Final = 1_725_000_000_000_000  # time_us of message 0
HEARTBEAT_EVERY: Final = 100  # generic/1: one heartbeat frame per this many data frames
BURST: Final = 64  # frames the upstream sends between yields, at full speed
START_CHUNK: Final = 100  # sessions started at once (the upstream's accept backlog is 100)
TEXT: Final = "a post-like body of some sixty characters, as small feeds send"
TARGET_RATIO: Final = 0.8
TARGET_MEMORY: Final = 0.10
REPO: Final = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Config:
    name: str
    connections: int  # throughput: connections at full speed
    settle_s: float
    window_s: float
    repeats: int  # throughput runs per protocol (alternating order)
    memory_steps: tuple[int, ...]  # idle-ish connections held at each memory step
    idle_rate: float  # msg/s per connection in the memory steps
    memory_window_s: float
    connect_timeout_s: float = 120.0


TINY = Config("tiny", 2, 0.5, 1.5, 1, (5, 20), 2.0, 1.0, connect_timeout_s=30.0)
QUICK = Config("quick", 10, 2.0, 5.0, 2, (200, 1000), 1.0, 3.0)
FULL = Config("full", 20, 3.0, 10.0, 3, (200, 1000), 1.0, 5.0)
CONFIGS: Final = {c.name: c for c in (TINY, QUICK, FULL)}


# ----------------------------------------------------------------------------- the messages


def payload(cid: str, n: int) -> str:
    """The message both protocols carry (their records' `data`), as compact JSON."""
    return (
        f'{{"time_us":{T0_US + n},"n":{n},"connection_id":"{cid}","kind":"commit",'
        f'"collection":"app.bsky.feed.post","text":"{TEXT}"}}'
    )


def seqfeed_frame(cid: str, n: int) -> str:
    return f'{{"type":"data","seq":{n},"data":{payload(cid, n)}}}'


def generic_frame(cid: str, n: int) -> str:
    return f'{{"type":"data","payload":{payload(cid, n)}}}'


HEARTBEAT_FRAME: Final = '{"type":"heartbeat"}'


def generic_config(base_url: str, rate: float, idle_timeout_s: float | None = None) -> dict[str, Any]:
    """The generic/1 config under test: unwrap, a monotonic cursor resumed in the URL, and one
    classify rule. Compression off, as the upstream offers none (nor does seqfeed/1's). With
    `idle_timeout_s`, an idle timer as Coinbase's and Kraken's presets have (an adapter timer)."""
    config: dict[str, Any] = {
        "protocol": "generic/1",
        "connect": {
            "url": f"{base_url}/generic/{{{{connection_id}}}}?rate={rate:g}"
            "{{#cursor}}&cursor={{cursor}}{{/cursor}}",
            "compression": "none",
        },
        "frames": {"unwrap": "/payload", "classify": [{"when": {"/type": "heartbeat"}, "action": "ignore"}]},
        "cursor": {"path": "/time_us", "order": "monotonic", "resume": {"in": "url", "inclusive": False}},
    }
    if idle_timeout_s is not None:
        config["keepalive"] = {"idle_timeout_s": idle_timeout_s}
    return config


# ----------------------------------------------------------------------------- the upstream


async def _drain(connection: Any) -> None:
    from websockets.exceptions import ConnectionClosed

    with contextlib.suppress(ConnectionClosed):
        async for _ in connection:
            pass


async def _handle(connection: Any) -> None:
    from websockets.exceptions import ConnectionClosed

    split = urlsplit(connection.request.path)
    kind, _, cid = split.path.strip("/").partition("/")
    query = parse_qs(split.query)
    rate = float(query.get("rate", ["0"])[0])
    try:
        if kind == "seqfeed":
            subscribe = json.loads(await connection.recv())
            start, make, heartbeats = int(subscribe["after_seq"]) + 1, seqfeed_frame, False
        elif kind == "generic":
            cursor = query.get("cursor")
            start = int(cursor[0]) - T0_US + 1 if cursor else 0
            make, heartbeats = generic_frame, True
        else:
            await connection.close(1008, "unknown path")
            return
        reader = asyncio.ensure_future(_drain(connection))
        try:
            await _send(connection, cid, start, rate, make=make, heartbeats=heartbeats)
        finally:
            reader.cancel()
    except ConnectionClosed:
        pass


async def _send(connection: Any, cid: str, n: int, rate: float, *, make: Any, heartbeats: bool) -> None:
    if rate <= 0:  # full speed: bursts, as fast as the socket drains
        while True:
            for _ in range(BURST):
                await connection.send(make(cid, n))
                n += 1
                if heartbeats and n % HEARTBEAT_EVERY == 0:
                    await connection.send(HEARTBEAT_FRAME)
            await asyncio.sleep(0)
    period = 1.0 / rate
    due = time.monotonic() + random.random() * period  # spread the connections' ticks
    while True:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        due += period
        await connection.send(make(cid, n))
        n += 1
        if heartbeats and n % HEARTBEAT_EVERY == 0:
            await connection.send(HEARTBEAT_FRAME)


async def _upstream_main() -> None:
    from websockets.asyncio.server import serve

    raise_open_files(8192)
    async with serve(_handle, "127.0.0.1", 0, compression=None, backlog=1024) as server:
        port = server.sockets[0].getsockname()[1]
        print(port, flush=True)
        await asyncio.Future()


@contextlib.contextmanager
def upstream() -> Any:
    """The upstream process: (its base URL, its pid)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.generic_vs_seqfeed", "upstream"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield f"ws://127.0.0.1:{port}", process.pid
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# ----------------------------------------------------------------------------- the worker


class _Held:
    """N ConnectionSessions of one protocol in this process, on leases that do not lapse."""

    def __init__(
        self, protocol: str, base_url: str, sink: Any = None, idle_timeout_s: float | None = None
    ) -> None:
        import io

        from leaseworker.observability.metrics import WorkerMetrics
        from leaseworker.observability.tracing import configure_tracing
        from leaseworker.settings import Settings
        from leaseworker.sinks.null import NullSink
        from leaseworker.worker.session_deps import SessionDeps

        self.protocol = protocol
        self.base_url = base_url
        self.idle_timeout_s = idle_timeout_s
        self.sink = NullSink() if sink is None else sink
        self.deps = SessionDeps(
            settings=Settings(worker_id="p8"),
            sink=self.sink,
            metrics=WorkerMetrics(namespace="bench", stream=io.StringIO()),
            tracing=configure_tracing(None),
        )
        self.sessions: list[Any] = []
        self.tasks: list[asyncio.Task[Any]] = []
        self.failures: list[str] = []

    def lease(self, index: int, rate: float) -> Any:
        from leaseworker.lease.model import Lease

        cid = f"p8-{self.protocol}-{index:05d}"
        lease = Lease(
            connection_id=cid,
            epoch=1,
            owner="p8",
            ws_url=f"{self.base_url}/seqfeed/{cid}?rate={rate:g}",
            start_seq=-1,
            valid_until=time.monotonic() + 86_400,
        )
        if self.protocol == "generic":
            lease.ws_url, lease.protocol = "", "generic/1"
            lease.protocol_config = json.dumps(generic_config(self.base_url, rate, self.idle_timeout_s))
        return lease

    def warm(self) -> None:
        """Build the protocol once (imports, compiled patterns), as a worker has before it holds."""
        from leaseworker.worker.session import ConnectionSession

        ConnectionSession(self.lease(99_999, 1.0), self.deps, self._record_failure)._build_protocol()

    async def _record_failure(self, lease: Any, reason: str) -> bool:
        self.failures.append(reason)
        return True

    async def hold(self, target: int, rate: float, timeout: float) -> bool:
        """Start sessions up to `target`, START_CHUNK at a time; True once every one delivered."""
        from leaseworker.worker.session import ConnectionSession

        while len(self.sessions) < target:
            chunk = range(len(self.sessions), min(target, len(self.sessions) + START_CHUNK))
            for index in chunk:
                session = ConnectionSession(self.lease(index, rate), self.deps, self._record_failure)
                self.sessions.append(session)
                self.tasks.append(asyncio.create_task(session.run()))
            if not await self._until_delivering(timeout):
                return False
        return await self._until_delivering(timeout)

    async def _until_delivering(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while any(s.delivered_seq == s.lease.start_seq for s in self.sessions):
            if time.monotonic() > deadline or any(t.done() for t in self.tasks):
                return False
            await asyncio.sleep(0.1)
        return True

    def delivered(self) -> int:
        return sum(s.delivered_seq - s.lease.start_seq for s in self.sessions)

    async def window(
        self, seconds: float, upstream_pid: int | None, profile: Path | None = None
    ) -> dict[str, Any]:
        pid = os.getpid()
        profiler = None
        if profile is not None:
            import cProfile

            profiler = cProfile.Profile()
        up0 = cpu_seconds(upstream_pid) if upstream_pid else 0.0
        n0, cpu0, t0 = self.delivered(), cpu_seconds(pid), time.monotonic()
        if profiler is not None:
            profiler.enable()
        await asyncio.sleep(seconds)
        if profiler is not None:
            profiler.disable()
        n1, cpu1, t1 = self.delivered(), cpu_seconds(pid), time.monotonic()
        up1 = cpu_seconds(upstream_pid) if upstream_pid else 0.0
        if profiler is not None and profile is not None:
            profiler.dump_stats(profile)
        wall, cpu, messages = t1 - t0, cpu1 - cpu0, n1 - n0
        return {
            "connections": len(self.sessions),
            "messages": messages,
            "wall_s": wall,
            "cpu_s": cpu,
            "msgs_per_s_wall": messages / wall,
            "worker_cores": cpu / wall,
            "upstream_cores": (up1 - up0) / wall,
            "msgs_per_cpu_s": messages / cpu if cpu > 0 else 0.0,
            "rss_bytes": rss_bytes(pid),
            "failures": len(self.failures),
        }

    async def stop(self) -> None:
        for session in self.sessions:
            session.request_release("bench over")
        await asyncio.wait(self.tasks, timeout=5)


async def _worker_main(args: argparse.Namespace) -> dict[str, Any]:
    import gc

    raise_open_files(2 * max(args.steps) + 1024)
    held = _Held(args.protocol, args.url)
    held.warm()
    gc.collect()
    baseline = rss_bytes(os.getpid())
    steps: list[dict[str, Any]] = []
    for target in args.steps:
        started = time.monotonic()
        ok = await held.hold(target, args.rate, args.connect_timeout)
        ready = time.monotonic() - started
        await asyncio.sleep(args.settle)
        step = await held.window(args.window, args.upstream_pid, args.profile_out)
        steps.append(step | {"all_delivering": ok, "connect_s": ready})
    result = {"protocol": args.protocol, "rate": args.rate, "baseline_rss_bytes": baseline, "steps": steps}
    result["sink_records"] = held.sink.records
    result["failure_reasons"] = sorted(set(held.failures))[:5]
    await held.stop()
    return result


def _run_worker(
    protocol: str,
    url: str,
    upstream_pid: int,
    *,
    steps: tuple[int, ...],
    rate: float,
    settle: float,
    window: float,
    connect_timeout: float,
    profile: Path | None = None,
) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "bench.generic_vs_seqfeed",
        "worker",
        "--protocol",
        protocol,
        "--url",
        url,
        "--upstream-pid",
        str(upstream_pid),
        "--rate",
        str(rate),
        "--settle",
        str(settle),
        "--window",
        str(window),
        "--connect-timeout",
        str(connect_timeout),
        *[arg for step in steps for arg in ("--step", str(step))],
        *(["--profile-out", str(profile)] if profile else []),
    ]
    limit = connect_timeout * (1 + len(steps)) + (settle + window) * len(steps) + 60
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=limit, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"P8 worker ({protocol}) failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# ----------------------------------------------------------------------------- the run


def run(mode: str) -> dict[str, Any]:
    config = CONFIGS[mode]
    raise_open_files(2 * max(config.memory_steps) + 1024)
    throughput: dict[str, list[dict[str, Any]]] = {p: [] for p in PROTOCOLS}
    memory: dict[str, dict[str, Any]] = {}
    with upstream() as (url, pid):
        for repeat in range(config.repeats):
            order = PROTOCOLS if repeat % 2 == 0 else tuple(reversed(PROTOCOLS))
            for protocol in order:
                result = _run_worker(
                    protocol,
                    url,
                    pid,
                    steps=(config.connections,),
                    rate=0.0,
                    settle=config.settle_s,
                    window=config.window_s,
                    connect_timeout=config.connect_timeout_s,
                )
                throughput[protocol].append(result["steps"][0] | {"sink_records": result["sink_records"]})
        for protocol in PROTOCOLS:
            memory[protocol] = _run_worker(
                protocol,
                url,
                pid,
                steps=config.memory_steps,
                rate=config.idle_rate,
                settle=config.settle_s,
                window=config.memory_window_s,
                connect_timeout=config.connect_timeout_s,
            )
    for result in memory.values():
        _per_connection(result)
    return {
        "config": asdict(config),
        "heartbeat_every": HEARTBEAT_EVERY,
        "payload_bytes": len(payload("p8-seqfeed-00000", 0)),
        "frame_bytes": {
            "seqfeed": len(seqfeed_frame("p8-seqfeed-00000", 0)),
            "generic": len(generic_frame("p8-generic-00000", 0)),
        },
        "generic_config": generic_config("ws://127.0.0.1:PORT", 0),
        "throughput": throughput,
        "memory": memory,
        "summary": summarise(throughput, memory),
    }


def _per_connection(result: dict[str, Any]) -> None:
    baseline = result["baseline_rss_bytes"]
    before_rss, before_n = baseline, 0
    for step in result["steps"]:
        n = step["connections"]
        step["marginal_kb_per_connection"] = (step["rss_bytes"] - baseline) / n / 1024
        step["step_kb_per_connection"] = (step["rss_bytes"] - before_rss) / (n - before_n) / 1024
        before_rss, before_n = step["rss_bytes"], n


def summarise(
    throughput: dict[str, list[dict[str, Any]]], memory: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    per_core = {p: statistics.median(r["msgs_per_cpu_s"] for r in runs) for p, runs in throughput.items()}
    wall = {p: statistics.median(r["msgs_per_s_wall"] for r in runs) for p, runs in throughput.items()}
    ratio = per_core["generic"] / per_core["seqfeed"] if per_core["seqfeed"] else 0.0
    # The marginal cost of one more connection: between the last two steps (or above the
    # baseline when there is one step).
    kb = {p: m["steps"][-1]["step_kb_per_connection"] for p, m in memory.items()}
    kb_marginal = {p: m["steps"][-1]["marginal_kb_per_connection"] for p, m in memory.items()}
    sparse = {p: m["steps"][-1]["msgs_per_cpu_s"] for p, m in memory.items()}
    memory_ratio = kb["generic"] / kb["seqfeed"] if kb["seqfeed"] > 0 else float("inf")
    return {
        "msgs_per_cpu_s": per_core,
        "msgs_per_s_wall": wall,
        "ratio": ratio,
        "throughput_met": ratio >= TARGET_RATIO,
        "kb_per_connection": kb,
        "marginal_kb_per_connection": kb_marginal,
        "memory_ratio": memory_ratio,
        "memory_met": abs(memory_ratio - 1) <= TARGET_MEMORY,
        "sparse_msgs_per_cpu_s": sparse,
        "sparse_ratio": sparse["generic"] / sparse["seqfeed"] if sparse["seqfeed"] else 0.0,
    }


# ----------------------------------------------------------------------------- the report


def _n(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"


def section(results: dict[str, Any]) -> list[str]:
    config, summary = results["config"], results["summary"]
    steps = config["memory_steps"]
    lines = [
        "## P8: generic/1 against seqfeed/1 (one worker process)",
        "",
        "Both protocols in one run (`bench/generic_vs_seqfeed.py`), same machine, null sink, same "
        f"payloads ({results['payload_bytes']} bytes of JSON; frames of "
        f"{results['frame_bytes']['seqfeed']} bytes seqfeed/1, {results['frame_bytes']['generic']} "
        "generic/1), through the real ConnectionSession and socket run. generic/1: "
        "`frames.unwrap /payload`, `cursor.path /time_us` monotonic (resume in the URL), a classify "
        f'rule ignoring `{{"type":"heartbeat"}}` (one heartbeat per {results["heartbeat_every"]} '
        "data frames). A local upstream process sends at full speed; each measurement is a fresh "
        "worker process; msgs/s per core = messages the sink acknowledged / the worker's CPU seconds "
        f"(utime + stime). Throughput: {config['connections']} connections at full speed, "
        f"{config['window_s']:g} s windows, {config['repeats']} run(s) per protocol in alternating "
        f"order, medians. Memory: RSS at {' and '.join(f'{s:,}' for s in steps)} connections at "
        f"{config['idle_rate']:g} msg/s each, above the worker's RSS after its imports.",
        "",
        "| protocol | run | msgs/s per core | msgs/s wall | worker cores | upstream cores |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for protocol, runs in results["throughput"].items():
        for index, run in enumerate(runs, 1):
            lines.append(
                f"| {protocol} | {index} | {_n(run['msgs_per_cpu_s'])} | {_n(run['msgs_per_s_wall'])} "
                f"| {run['worker_cores']:.2f} | {run['upstream_cores']:.2f} |"
            )
    lines += [
        "",
        "| protocol | connections | RSS (MB) | KB/conn above baseline | KB/conn from the step before "
        "| msgs/s per core (sparse) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for protocol, result in results["memory"].items():
        lines.append(f"| {protocol} | 0 | {result['baseline_rss_bytes'] / 2**20:.1f} | | | |")
        for step in result["steps"]:
            lines.append(
                f"| {protocol} | {step['connections']:,} | {step['rss_bytes'] / 2**20:.1f} "
                f"| {step['marginal_kb_per_connection']:.1f} | {step['step_kb_per_connection']:.1f} "
                f"| {_n(step['msgs_per_cpu_s'])} |"
            )
    per_core, kb = summary["msgs_per_cpu_s"], summary["kb_per_connection"]
    lines += [
        "",
        f"- msgs/s per core, generic/1 / seqfeed/1: {_n(per_core['generic'])} / "
        f"{_n(per_core['seqfeed'])} = **{summary['ratio']:.2f}** (target >= {TARGET_RATIO}): "
        f"**{'met' if summary['throughput_met'] else 'missed'}**. At {steps[-1]:,} sparse connections "
        f"({config['idle_rate']:g} msg/s each): {summary['sparse_ratio']:.2f}.",
        f"- KB per connection ({steps[0]:,} -> {steps[-1]:,}), generic/1 / seqfeed/1: "
        f"{kb['generic']:.1f} / {kb['seqfeed']:.1f} = **{summary['memory_ratio']:.2f}** "
        f"(target within {TARGET_MEMORY:.0%}): **{'met' if summary['memory_met'] else 'missed'}**.",
        "",
        "    .venv/bin/python -m bench.run --mode quick --parts p8",
        "    .venv/bin/python -m bench.generic_vs_seqfeed --mode quick          # P8 alone, printed",
        "    .venv/bin/python -m bench.generic_vs_seqfeed --profile generic     # cProfile one window",
    ]
    return lines


# ----------------------------------------------------------------------------- command line


def _profile(protocol: str, config: Config, out: Path) -> None:
    import pstats

    with upstream() as (url, pid):
        result = _run_worker(
            protocol,
            url,
            pid,
            steps=(config.connections,),
            rate=0.0,
            settle=config.settle_s,
            window=config.window_s,
            connect_timeout=config.connect_timeout_s,
            profile=out,
        )
    print(f"{protocol}: {result['steps'][0]['msgs_per_cpu_s']:,.0f} msgs/s per core under cProfile")
    pstats.Stats(str(out)).sort_stats("tottime").print_stats(25)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.generic_vs_seqfeed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("upstream", help="(internal) serve both protocols; prints the port")
    worker = sub.add_parser("worker", help="(internal) one measured worker process; prints JSON")
    worker.add_argument("--protocol", choices=PROTOCOLS, required=True)
    worker.add_argument("--url", required=True)
    worker.add_argument("--upstream-pid", type=int, default=0)
    worker.add_argument("--step", dest="steps", type=int, action="append", required=True)
    worker.add_argument("--rate", type=float, default=0.0)
    worker.add_argument("--settle", type=float, default=1.0)
    worker.add_argument("--window", type=float, default=2.0)
    worker.add_argument("--connect-timeout", type=float, default=60.0)
    worker.add_argument("--profile-out", type=Path)
    parser.add_argument("--mode", choices=sorted(CONFIGS), default="quick")
    parser.add_argument("--out", type=Path, help="write p8.json here")
    parser.add_argument("--profile", choices=PROTOCOLS, help="cProfile one throughput window instead")
    args = parser.parse_args(argv)
    if args.command == "upstream":
        asyncio.run(_upstream_main())
        return 0
    if args.command == "worker":
        print(json.dumps(asyncio.run(_worker_main(args))))
        return 0
    if args.profile:
        _profile(args.profile, CONFIGS[args.mode], Path(f"/tmp/p8-{args.profile}.prof"))
        return 0
    results = run(args.mode)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "p8.json").write_text(json.dumps(results, indent=1) + "\n")
    print("\n".join(section(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
