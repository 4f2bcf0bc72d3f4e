"""Run a local fleet through a seeded schedule of nemeses, then judge it (issue 11).

The fleet: DynamoDB Local, moto (SQS hints and the Kinesis stream that is the one arbiter of
arrival order), the seqfeed/1 feed, BASE_WORKERS workers, one of which talks to DynamoDB through
the fault proxy. After every nemesis the fleet is restored to at least BASE_WORKERS live workers
(a replacement takes the proxied slot if its holder is gone). At the end the stream is read in
shard order, the lease table's own change stream gives every write it took (`table_history`),
and `verdict.judge` gives one table.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aioboto3

from leaseworker.lease.rendezvous import rank
from leaseworker.worker.takeover_bound import takeover_bound_s
from leaseworker_dev.chaos import unsafe_worker
from leaseworker_dev.chaos.arbiter import start_arbiter
from leaseworker_dev.chaos.nemeses import Measure, build
from leaseworker_dev.chaos.observe import MemorySampler, TableReading, TableSampler, slope_kib_per_min
from leaseworker_dev.chaos.schedule import Schedule
from leaseworker_dev.chaos.table_history import checkpoint_regressions, enable, fenced_by_peers, read_all
from leaseworker_dev.chaos.throttle_proxy import FaultProxyThread
from leaseworker_dev.chaos.unsafe import CONFIRM_VALUE, CONFIRM_VAR, DISABLE_VAR
from leaseworker_dev.chaos.verdict import Evidence, Verdict, judge
from leaseworker_dev.local.events import FENCE_PATH_S
from leaseworker_dev.local.fleet import FAST, WORKER_ENTRY, Fleet, Timings, poll_until
from leaseworker_dev.local.invariants import read_events
from leaseworker_dev.local.services import LOCAL_CREDENTIALS
from leaseworker_dev.local.stream import read_arrivals_sync

STREAM: Final = "leaseworker-chaos"
BASE_WORKERS: Final = 3
# scale_out adds workers only up to this many live ones: a 300 s run drew 8 scale-outs and 3
# scale-ins, and 14 workers on 2 cores starved everything (rolling restarts of 14, and timings
# that measured the machine instead of the protocol).
MAX_WORKERS: Final = 6
CONNECT_ALLOWANCE_S: Final = 1.5  # as tests/system/test_failover.py: connect + subscribe under load
DEFAULT_FEED_RATE: Final = 4.0  # messages per second per connection
L2_BOUND_S: Final = 1.5  # "about one second" (docs/design.md §2c)
RESTORE_AFTER_S: Final = 1.0  # after a nemesis stops, before replacing lost workers
SETTLE_S: Final = 8.0  # after a fault window, moves are still attributed to it (rebalancing)
# A worker that joins (a replacement after a fault, a scale-out, a rolling restart's successor)
# is a fleet change: the moves that rebalance onto it are its effect, not churn. They begin once
# its session is in the table, and end within one heartbeat (to be listed) and the shedders'
# halving rounds, each one reconcile (x1.2 jitter) and one more for two views to agree: log2(12)
# + 2 = 6 rounds for the soak's largest excess (24 connections, 2 -> 3 workers), plus 2 for a
# claimer that took one above its share and sheds it again. At the fast timings (H = R = 1 s):
# 1 + 8 x 1.2 = 10.6 s; the window adds a third for a loaded machine. Seen: moves up to 11.9 s
# after the joiner's first log line in the 30-minute soak of 2026-12-04. The window is counted
# from the session's first appearance, not from the spawn: a start-up on busy cores took 14-17 s
# (2026-12-07, three workers spawned together in the session run), and a window counted from
# the spawn closed before the joiners had even written their sessions.
JOIN_SETTLE_S: Final = 14.0
# A worker with an expected exit (a woken SIGSTOP learns of its fence at its next heartbeat; a
# SIGTERM shuts down within its grace) may still be on its way out when the schedule ends: a
# start-up that ran long on the shared cores stretches a rolling restart past the last recovery.
EXIT_WAIT_S: Final = 15.0


@dataclass
class RunConfig:
    schedule: Schedule
    root: Path
    connections: int = 24
    # Each message at this rate is its own PutRecords (they are further apart than the batch
    # linger), and the one arbiter (moto's Kinesis, in Python) is shared by the whole fleet on
    # the same cores: at 10/s x 24 connections its queueing, not the workers, set the handoff
    # times. 4/s keeps thousands of records per run and the arbiter well below saturation.
    feed_rate: float = DEFAULT_FEED_RATE
    timings: Timings = FAST
    unsafe: str | None = None  # a negative control: LEASEWORKER_UNSAFE_TEST_ONLY_DISABLE value
    hold_releases_s: float = 0.0  # the proxied worker's releases wait this long (throttle_proxy.py)
    protect: int = 0  # base workers no process nemesis may pick (the soak measures their memory)
    verbose: bool = True


@dataclass
class ChaosRun:
    config: RunConfig
    fleet: Fleet
    proxy: FaultProxyThread
    measures: list[Measure] = field(default_factory=list)
    log: list[dict[str, Any]] = field(default_factory=list)
    doomed: set[str] = field(default_factory=set)
    protected: set[str] = field(default_factory=set)
    bad: list[str] = field(default_factory=list)
    arbiter_url: str = ""
    table_stream: str = ""  # the lease table's change stream: every write, for S3 (table_history.py)
    _proxied: str | None = None
    _counter: int = 0
    started: float = field(default_factory=time.monotonic)
    joins_ms: list[tuple[str, int]] = field(default_factory=list)  # (worker, wall ms) started mid-run

    # ------------------------------------------------------------------ the Chaos protocol

    def say(self, text: str) -> None:
        entry = {"t": round(time.monotonic() - self.started, 2), "msg": text}
        self.log.append(entry)
        if self.config.verbose:
            print(f"[chaos {entry['t']:7.2f}s] {text}", flush=True)

    def alive(self) -> list[str]:
        return sorted(
            name for name, w in self.fleet.workers.items() if w.process.alive() and name not in self.doomed
        )

    def doom(self, worker: str) -> None:
        """`worker` is expected to exit (fenced): no other nemesis may pick it, and the fleet is
        restored without it (a rolling restart's SIGTERM would make it exit 0 instead of 3)."""
        self.doomed.add(worker)

    def room(self) -> int:
        """How many workers scale_out may still add."""
        return max(0, MAX_WORKERS - len(self.alive()))

    def proxied(self) -> str | None:
        return self._proxied if self._proxied in self.alive() else None

    def victim(self, target: int, *, exclude_proxied: bool = False, heir: str | None = None) -> str | None:
        """The drawn slot's worker; with `heir`, the worker whose death leaves `heir` the most
        connections as first choice (rendezvous over the survivors), the drawn slot breaking ties."""
        candidates = [
            w
            for w in self.alive()
            if w not in self.protected and not (exclude_proxied and w == self._proxied)
        ]
        if len(self.alive()) < 2 or not candidates:
            return None  # never take the last worker: nobody would be left to take over
        start = target % len(candidates)
        candidates = candidates[start:] + candidates[:start]
        chosen = candidates[0]
        if heir is not None:
            alive, leases = self.alive(), self.fleet.leases()  # one scan for every candidate

            def inherited(dead: str) -> int:
                survivors = [w for w in alive if w != dead]
                held = (cid for cid, (owner, _) in leases.items() if owner == dead)
                return sum(1 for cid in held if rank(cid, survivors)[0] == heir)

            chosen = max(candidates, key=inherited)
        self.doomed.add(chosen)
        return chosen

    def start_worker(self, *, proxied: bool = False, extra_env: dict[str, str] | None = None) -> str:
        self._counter += 1
        name = f"w{self._counter}"
        env = {"AWS_ENDPOINT_URL_KINESIS": self.arbiter_url, **(extra_env or {})}
        if proxied:
            env["AWS_ENDPOINT_URL_DYNAMODB"] = self.proxy.url
            self._proxied = name
        entry = WORKER_ENTRY
        if self.config.unsafe:  # a negative control: only its own entry point applies it
            env.update({DISABLE_VAR: self.config.unsafe, CONFIRM_VAR: CONFIRM_VALUE})
            entry = (unsafe_worker.MODULE,)
        self.fleet.start_worker(name, extra_env=env, entry=entry)
        self.joins_ms.append((name, _now_ms()))
        self.say(f"started {name}{' (behind the DynamoDB proxy)' if proxied else ''}")
        return name

    def held_by(self, worker: str) -> dict[str, int]:
        return {cid: epoch for cid, (owner, epoch) in self.fleet.leases().items() if owner == worker}

    def add_bad_connections(self, faults: list[str]) -> list[str]:
        ids = []
        for fault in faults:
            cid = f"bad-{len(self.bad):02d}-{fault}"
            self.fleet.add_connection(cid, self.fleet.url_for(cid, mode=fault))
            self.bad.append(cid)
            ids.append(cid)
        return ids

    # ------------------------------------------------------------------ restoring

    def restore(self) -> None:
        for name in list(self.doomed):
            if not self.fleet.workers[name].process.alive():
                self.doomed.discard(name)  # settled: it stays out of alive() by having exited
        need_proxy = self.proxied() is None
        while len(self.alive()) < BASE_WORKERS:
            self.start_worker(proxied=need_proxy)
            need_proxy = False
        if need_proxy:
            self.start_worker(proxied=True)


def join_windows(joins_ms: list[tuple[str, int]], readings: list[TableReading]) -> list[tuple[str, int, int]]:
    """The moves a joining worker causes, attributed to it: from its spawn until JOIN_SETTLE_S
    after the first reading that holds its session (the spawn, if no reading ever did)."""
    windows = []
    for name, spawned in joins_ms:
        seen = next((r.t_ms for r in readings if r.t_ms >= spawned and name in r.sessions), spawned)
        windows.append(("join", spawned, seen + int(JOIN_SETTLE_S * 1000)))
    return windows


def run(config: RunConfig) -> Verdict:
    schedule = config.schedule
    print(
        f"chaos: seed={schedule.seed} mode={schedule.mode} duration={schedule.duration:.0f}s "
        f"nemeses={len(schedule.nemeses)} unsafe={config.unsafe or '-'}",
        flush=True,
    )
    print(
        f"chaos: replay with: python -m leaseworker_dev.chaos --seed {schedule.seed} --duration "
        f"{schedule.duration:g} --mode {schedule.mode}",
        flush=True,
    )
    config.root.mkdir(parents=True, exist_ok=True)
    for name, value in LOCAL_CREDENTIALS.items():  # this process reads the stream at the end
        os.environ.setdefault(name, value)
    (config.root / "schedule.json").write_text(schedule.as_json())
    fleet = Fleet(
        config.root,
        timings=config.timings,
        feed_rate=config.feed_rate,
        lease_mode=schedule.mode,
        sink=f"kinesis:{STREAM}",
    )
    with fleet:
        assert fleet.dynamodb is not None
        arbiter = start_arbiter(log_path=fleet.logs / "moto-kinesis.log")
        try:
            _create_stream(arbiter.url)
            table_stream = asyncio.run(enable(fleet.endpoint))  # before any worker writes
            proxy = FaultProxyThread("127.0.0.1", fleet.dynamodb.port, seed=schedule.seed)
            with proxy:
                proxy.hold_releases(config.hold_releases_s)
                chaos = ChaosRun(config, fleet, proxy, arbiter_url=arbiter.url, table_stream=table_stream)
                return _execute(chaos)
        finally:
            arbiter.stop()


def _execute(chaos: ChaosRun) -> Verdict:
    config, fleet, schedule = chaos.config, chaos.fleet, chaos.config.schedule
    ids = [f"c-{i:02d}" for i in range(config.connections)]
    fleet.add_connections(ids)
    chaos.start_worker(proxied=True)
    for index in range(BASE_WORKERS - 1):
        name = chaos.start_worker()
        if index < config.protect:
            chaos.protected.add(name)
    if not poll_until(lambda: _all_owned(chaos, ids), 60, interval=0.25):
        raise RuntimeError(f"the fleet did not own all {len(ids)} connections within 60 s")
    table, memory = TableSampler(fleet), MemorySampler(fleet)
    table.start()
    memory.start()
    windows: list[tuple[str, int, int]] = []
    counts: dict[str, int] = {}
    chaos.started = t0 = time.monotonic()
    windows.append(("warmup", _now_ms() - 60_000, _now_ms() + 4000))
    chaos.joins_ms.clear()  # the initial fleet's rebalancing is the warmup's
    recovered_by = t0
    try:
        for spec in schedule.nemeses:
            _sleep_until(t0 + spec.at)
            nemesis = build(spec)
            nemesis.ready(chaos)
            chaos.say(f"{spec.kind} start {json.dumps(spec.params)} (duration {spec.duration:g} s)")
            begin, started = _now_ms(), time.monotonic()
            nemesis.start(chaos)
            # From when it really started: a run behind its schedule (a long rolling restart)
            # must still pause or partition for the whole duration (seen: a SIGSTOP woken at once).
            _sleep_until(started + spec.duration)
            nemesis.stop(chaos)
            windows.append((spec.kind, begin, _now_ms() + int((spec.recovery + SETTLE_S) * 1000)))
            counts[spec.kind] = counts.get(spec.kind, 0) + 1
            time.sleep(RESTORE_AFTER_S)
            chaos.restore()
            # A nemesis that ran long (a rolling restart waits for each successor) shifts the
            # rest; its recovery is still owed before the verdict (a woken worker's exit 3).
            recovered_by = time.monotonic() + spec.recovery
        _sleep_until(max(t0 + schedule.duration, recovered_by))
    finally:
        table.halt.set()
        memory.halt.set()
        table.join(10)
        memory.join(10)
    _await_expected_exits(fleet, chaos.measures)
    exits = {name: w.process.popen.poll() for name, w in fleet.workers.items()}
    # Stopped before the read (moto's GetRecords iterates the shard unlocked: a concurrent put
    # fails it), and before the proxy and the arbiter they talk to go away.
    _stop_workers(fleet)
    arrivals = read_arrivals_sync(chaos.arbiter_url, STREAM)
    writes = asyncio.run(read_all(fleet.endpoint, chaos.table_stream))
    mode = schedule.mode
    evidence = Evidence(
        seed=schedule.seed,
        mode=mode,
        arrivals=arrivals,
        readings=table.readings,
        events=read_events(fleet.feed_log),
        measures=chaos.measures,
        exits=exits,
        windows=windows + join_windows(chaos.joins_ms, table.readings),
        bad_connections=set(chaos.bad),
        nemeses=counts,
        l1_bound_s=takeover_bound_s(mode, config.timings, CONNECT_ALLOWANCE_S),
        l2_bound_s=L2_BOUND_S,
        l1_fence_bound_s=FENCE_PATH_S + CONNECT_ALLOWANCE_S,
        written_back=checkpoint_regressions(writes),
        lease_s=config.timings.lease_seconds,
        fenced=fenced_by_peers(writes),
    )
    verdict = judge(evidence)
    verdict.extra.update(_memory_summary(memory))
    verdict.extra["sampler_errors"] = table.errors[:5]
    verdict.extra["table_writes"] = len(writes)
    verdict.extra["fenced_by_peers"] = sorted(evidence.fenced)
    verdict.extra["unsafe"] = config.unsafe
    verdict.extra["injected_throttles"] = chaos.proxy.injected()
    verdict.extra["lost_replies"] = chaos.proxy.lost()
    verdict.extra["worker_log_counts"] = worker_log_counts(fleet.logs)
    verdict.extra["log"] = chaos.log
    (config.root / "verdict.json").write_text(json.dumps(verdict.as_dict(), indent=2))
    return verdict


# What the workers' logs say about lost replies and their repair (worker/acquirer.py, worker/audit.py).
LOG_MARKERS: Final = {
    "acquire_reply_lost": "acquire reply lost; reading back",
    "adopted_after_lost_reply": "adopted a lease whose acquire reply was lost",
    "leases_repaired": "audit repair:",  # one line per LeasesRepaired count
}


def worker_log_counts(logs: Path) -> dict[str, int]:
    """How many lines of every worker's log carry each of LOG_MARKERS."""
    counts = dict.fromkeys(LOG_MARKERS, 0)
    for path in sorted(logs.glob("w*.log")):
        with contextlib.suppress(OSError):
            for line in path.read_text(errors="replace").splitlines():
                for name, marker in LOG_MARKERS.items():
                    if marker in line:
                        counts[name] += 1
    return counts


def _await_expected_exits(fleet: Fleet, measures: list[Measure]) -> None:
    """Give each worker that should have exited a bounded time to do so before its status is
    read (one wait for them all); one that never exits still fails the exit-status row."""
    expected = {m.worker for m in measures if m.expect_exit is not None and m.worker in fleet.workers}
    poll_until(lambda: all(fleet.workers[w].process.popen.poll() is not None for w in expected), EXIT_WAIT_S)


def _stop_workers(fleet: Fleet) -> None:
    running = [w for w in fleet.workers.values() if w.process.alive()]
    for worker in running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGCONT)
            os.killpg(worker.pid, signal.SIGTERM)
    for worker in running:
        worker.process.stop(timeout=fleet.timings.shutdown_grace_seconds + 2)


def _memory_summary(memory: MemorySampler) -> dict[str, Any]:
    slopes = {
        name: round(slope_kib_per_min([p for p in points if p[0] >= 30.0] or points), 1)
        for name, points in memory.samples.items()
        if len(points) >= 10
    }
    peak = {name: max(kib for _, kib in points) for name, points in memory.samples.items()}
    return {"rss_slope_kib_per_min": slopes, "rss_peak_kib": peak}


def _all_owned(chaos: ChaosRun, ids: list[str]) -> bool:
    owners = chaos.fleet.leases()
    alive = set(chaos.alive())
    held = [owners.get(cid, (None, 0))[0] for cid in ids]
    return all(owner in alive for owner in held) and len({*held}) == len(alive)


def _create_stream(endpoint: str) -> None:
    async def create() -> None:
        session = aioboto3.Session()
        async with session.client(
            "kinesis",
            endpoint_url=endpoint,
            region_name=LOCAL_CREDENTIALS["AWS_REGION"],
            aws_access_key_id="local",
            aws_secret_access_key="local",
        ) as client:
            await client.create_stream(StreamName=STREAM, ShardCount=1)
            await client.get_waiter("stream_exists").wait(StreamName=STREAM, WaiterConfig={"Delay": 1})

    asyncio.run(create())


def _sleep_until(deadline: float) -> None:
    with contextlib.suppress(ValueError):
        time.sleep(max(0.0, deadline - time.monotonic()))


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
