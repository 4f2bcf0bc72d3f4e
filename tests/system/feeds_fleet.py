"""A small fleet for the real-feed system tests (test_feeds.py), and the checks they judge by.

The fleet: a lease table (and an SQS queue for the hints) on the run's shared DynamoDB Local and
moto, the local replays of real feeds (leaseworker.feed.replays) served from a thread of the test
process so that their ledgers (what each socket was SENT) can be read, `leaseworker run` worker
processes (supervisor + worker child) with a file sink, and a sink tailer.

The tailer is the single arbiter of arrival order for the file sink: one thread reads every
`<worker>.jsonl` in turn, every few milliseconds, and numbers its reads. A line carries the
number of the read that first saw it (`seen`) and of the previous read of its file, which did
not (`unseen`). Line L was then certainly written after line M when M's read came before L's
unseen read (`M.seen < L.unseen`), or when both are in one file and L comes later: that is the
order S1 is judged in, with no worker's clock involved. (Two writes closer together than one
read of each file are not ordered by it; then the one-clock check on `received_at_ms` — every
process runs on this host — still holds them.)

The checks take the tailer's arrivals and the replays' ledgers and return violations (strings),
so that a test can show they fail on doctored output (the negative controls).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import botocore.session

from leaseworker.consumer import ConnectionFilter
from leaseworker.feed.replays import Entry, ReplayServer
from leaseworker.feed.replays.coinbase import TRADE_ID_BASE
from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.local.admin_loop import AdminLoop
from leaseworker.local.fleet import Timings
from leaseworker.local.services import LOCAL_CREDENTIALS
from leaseworker.protocol.presets import expand
from leaseworker.supervisor.process import child_pids
from tests.system.procscan import MARKER_VAR

TAIL_INTERVAL_S = 0.005
TAPE_SLACK_MS = 50  # a replay's tape maps its monotonic start to the wall clock once


# ----------------------------------------------------------------------------- the sink tailer


@dataclass(frozen=True, slots=True)
class Arrival:
    record: dict[str, Any]
    file: str
    line: int  # in its file, from 0
    seen: int  # the tailer's read that first saw the line
    unseen: int  # the previous read of the same file (which did not see it); -1: none

    @property
    def cid(self) -> str:
        return str(self.record["connection_id"])

    @property
    def epoch(self) -> int:
        return int(self.record["epoch"])

    @property
    def seq(self) -> int:
        return int(self.record["seq"])


class SinkTailer(threading.Thread):
    def __init__(self, directory: Path) -> None:
        super().__init__(daemon=True, name="sink-tailer")
        self.directory = directory
        self.halt = threading.Event()
        self._lock = threading.Lock()
        self._arrivals: list[Arrival] = []
        self._reads = 0
        self._files: dict[str, tuple[Any, bytes, int, int]] = {}  # name: (file, partial, lines, last read)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                self.poll()
                time.sleep(TAIL_INTERVAL_S)
            self.poll()
        except BaseException as error:  # surfaced by arrivals()
            self.error = error

    def poll(self) -> None:
        with self._lock:
            for path in sorted(self.directory.glob("*.jsonl")):
                self._read(path)

    def _read(self, path: Path) -> None:
        name = path.name
        if name not in self._files:
            self._files[name] = (path.open("rb"), b"", 0, -1)
        handle, partial, lines, previous = self._files[name]
        self._reads += 1
        read = self._reads
        data = partial + handle.read()
        *complete, partial = data.split(b"\n")
        for raw in complete:
            try:
                record = json.loads(raw)
            except ValueError as error:
                raise AssertionError(f"{name}:{lines + 1}: torn or invalid line: {error}") from None
            self._arrivals.append(Arrival(record, name, lines, read, previous))
            lines += 1
        self._files[name] = (handle, partial, lines, read)

    def arrivals(self) -> list[Arrival]:
        """Every line so far, in the order the tailer saw them (reads, then lines)."""
        if self.error is not None:
            raise self.error
        with self._lock:
            return list(self._arrivals)

    def stop(self) -> list[Arrival]:
        self.halt.set()
        self.join(10)
        arrivals = self.arrivals()
        with self._lock:
            for handle, partial, _, _ in self._files.values():
                assert not partial, f"a sink file ends in a torn line: {partial[:80]!r}"
                handle.close()
        return arrivals


# ----------------------------------------------------------------------------- the replays


class Replays:
    """Replay servers on one event loop in a thread of the test process (their ledgers are read
    from here)."""

    def __init__(self, specs: dict[str, dict[str, Any]]) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="replays", daemon=True)
        self._specs = specs
        self.servers: dict[str, ReplayServer] = {}

    def start(self) -> None:
        self._thread.start()

        async def enter() -> None:
            for name, options in self._specs.items():
                server = ReplayServer(feed=name, port=0, **options)
                self.servers[name] = await server.__aenter__()

        asyncio.run_coroutine_threadsafe(enter(), self._loop).result(10)

    def ledger(self, name: str) -> list[Entry]:
        async def copy() -> list[Entry]:
            return list(self.servers[name].ledger.entries)

        if self._loop.is_closed():
            return list(self.servers[name].ledger.entries)
        return asyncio.run_coroutine_threadsafe(copy(), self._loop).result(10)

    def stop(self) -> None:
        if self._loop.is_closed():
            return

        async def leave() -> None:
            for server in self.servers.values():
                with contextlib.suppress(Exception):
                    await server.__aexit__(None, None, None)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(leave(), self._loop).result(15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


# ----------------------------------------------------------------------------- the fleet


@dataclass
class Worker:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def child(self) -> int:
        children = child_pids(self.popen.pid)
        assert len(children) == 1, (self.name, children)
        return children[0]

    def tail(self, lines: int = 12) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()[-lines:]


@dataclass
class FeedsFleet:
    root: Path
    dynamodb_endpoint: str
    moto_endpoint: str
    marker: str
    lease_mode: str
    timings: Timings
    table: str = field(default_factory=lambda: f"feeds-{uuid.uuid4().hex[:8]}")
    workers: dict[str, Worker] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sink_dir = self.root / "sink"
        self.logs = self.root / "logs"
        self.sink_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.admin = AdminLoop(self.dynamodb_endpoint, self.table)
        self.sqs: Any = botocore.session.get_session().create_client(
            "sqs",
            endpoint_url=self.moto_endpoint,
            region_name=LOCAL_CREDENTIALS["AWS_REGION"],
            aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )
        self.queue_url = ""
        self.tailer = SinkTailer(self.sink_dir)
        self.replays: Replays | None = None

    # -- lifecycle

    def start(self, replays: dict[str, dict[str, Any]]) -> None:
        self.admin.call(lambda admin: admin.create_table())
        queue = f"hints-{uuid.uuid4().hex[:8]}"
        self.queue_url = self.sqs.create_queue(QueueName=queue)["QueueUrl"]
        self.replays = Replays(replays)
        self.replays.start()
        self.tailer.start()

    def close(self) -> None:
        for worker in self.workers.values():
            if worker.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(worker.popen.pid, signal.SIGCONT)
                    os.killpg(worker.popen.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    worker.popen.wait(10)
        if self.tailer.is_alive():
            self.tailer.halt.set()
            self.tailer.join(10)
        if self.replays is not None:
            self.replays.stop()
        self.admin.close()
        with contextlib.suppress(Exception):
            self.sqs.delete_queue(QueueUrl=self.queue_url)

    def save_ledger(self, name: str, entries: Sequence[Entry]) -> None:
        with (self.root / f"ledger-{name}.jsonl").open("w") as out:
            for e in entries:
                out.write(json.dumps([e.kind, e.t_ms, e.conn, e.key, e.cursor, e.message, e.code]) + "\n")

    # -- connections

    def add_preset(self, connection_id: str, preset: str, params: dict[str, str]) -> dict[str, Any]:
        """`connections add ID --preset NAME --param …`, through the admin API."""
        config = expand(preset, params)
        url = str(config["connect"]["url"])
        text = json.dumps(config)

        async def add(admin: LeaseTableAdmin) -> None:
            await admin.add(connection_id, url, protocol="generic/1", protocol_config=text, preset=preset)

        self.admin.call(add)
        return config

    def leases(self) -> dict[str, tuple[str | None, int]]:
        items: list[dict[str, Any]] = self.admin.call(lambda admin: admin.list())
        return {
            str(item["connection_id"]): (item.get("lease_owner"), int(item.get("lease_epoch", 0)))
            for item in items
        }

    def session(self, name: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self.admin.call(lambda admin: admin.raw_item(f"worker#{name}"))
        return result

    # -- workers

    def env(self, name: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "OTEL_"))}
        env.update(LOCAL_CREDENTIALS)
        env.update(self.timings.env())
        env.update(
            {
                "TABLE_NAME": self.table,
                "AWS_ENDPOINT_URL_DYNAMODB": self.dynamodb_endpoint,
                "AWS_ENDPOINT_URL_SQS": self.moto_endpoint,
                "NOTIFY_QUEUE_URL": self.queue_url,
                "LEASE_MODE": self.lease_mode,
                "SINK": f"file:{self.sink_dir}",
                "WORKER_ID": name,
                "PYTHONUNBUFFERED": "1",
                MARKER_VAR: self.marker,
            }
        )
        env.update(extra or {})
        return env

    def start_worker(self, name: str, extra_env: dict[str, str] | None = None) -> Worker:
        log = self.logs / f"{name}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "leaseworker", "run"],
                env=self.env(name, extra_env),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        worker = Worker(name, popen, log)
        self.workers[name] = worker
        return worker

    def wait_exit(self, name: str, timeout: float) -> int | None:
        try:
            return self.workers[name].popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


# ----------------------------------------------------------------------------- the checks


def by_connection(arrivals: Iterable[Arrival]) -> dict[str, list[Arrival]]:
    grouped: dict[str, list[Arrival]] = defaultdict(list)
    for arrival in arrivals:
        grouped[arrival.cid].append(arrival)
    return dict(grouped)


def certainly_after(later: Arrival, earlier: Arrival) -> bool:
    """`later` was written after `earlier`, as the tailer's reads prove."""
    if later.file == earlier.file:
        return later.line > earlier.line
    return earlier.seen < later.unseen


def check_s1(arrivals: Sequence[Arrival]) -> list[str]:
    """S1 (docs/design.md §2c): no record of epoch e arrives after one of a higher epoch.

    Judged twice: in the tailer's arrival order (only what its reads prove), and on the one
    clock every process here shares (`received_at_ms`: everything of epoch e was received before
    anything of a higher epoch)."""
    violations: list[str] = []
    for cid, items in by_connection(arrivals).items():
        epochs = sorted({a.epoch for a in items})
        for epoch in epochs:
            lower = [a for a in items if a.epoch == epoch]
            higher = [a for a in items if a.epoch > epoch]
            if not higher:
                continue
            first_higher = min(higher, key=lambda a: a.seen)
            for item in lower:
                late = [h for h in higher if certainly_after(item, h)]
                if late:
                    violations.append(
                        f"S1 {cid}: epoch {epoch} seq {item.seq} ({item.file}:{item.line + 1}) "
                        f"arrived after epoch {late[0].epoch} seq {late[0].record['seq']} "
                        f"({late[0].file}:{late[0].line + 1})"
                    )
                    break
            last_received = max(int(a.record["received_at_ms"]) for a in lower)
            first_received = min(int(a.record["received_at_ms"]) for a in higher)
            if last_received > first_received:
                violations.append(
                    f"S1 {cid}: epoch {epoch} received a record at {last_received} ms, after a higher "
                    f"epoch's first at {first_received} ms (first seen in {first_higher.file})"
                )
    return violations


def check_seqs(arrivals: Sequence[Arrival]) -> list[str]:
    """generic/1 numbering: within each epoch, seq covers 0..max with no hole."""
    violations: list[str] = []
    seqs: dict[tuple[str, int], set[int]] = defaultdict(set)
    for a in arrivals:
        seqs[(a.cid, a.epoch)].add(int(a.record["seq"]))
    for (cid, epoch), found in sorted(seqs.items()):
        missing = sorted(set(range(max(found) + 1)) - found)
        if missing:
            violations.append(f"seq {cid} epoch {epoch}: {len(missing)} seqs missing, first {missing[:5]}")
    return violations


def consumer_view(arrivals: Sequence[Arrival]) -> list[dict[str, Any]]:
    """What a consumer keeps: the records in arrival order through ConnectionFilter."""
    consumer = ConnectionFilter()
    return [a.record for a in arrivals if consumer.admit(a.record)]


def check_consumer(arrivals: Sequence[Arrival], cid: str) -> list[str]:
    """After the filter, each upstream message once and in order (per key): exactly the set of
    cursors the sink holds, ascending."""
    violations: list[str] = []
    mine = [a for a in arrivals if a.cid == cid]
    kept = [r for r in consumer_view(mine) if r["kind"] == "data"]
    held: dict[Any, set[Any]] = defaultdict(set)
    for a in mine:
        if a.record["kind"] == "data":
            held[a.record.get("key")].add(a.record["cursor"])
    for key, cursors in held.items():
        yielded = [r["cursor"] for r in kept if r.get("key") == key]
        if yielded != sorted(cursors):
            twice = sorted({c for c in yielded if yielded.count(c) > 1})[:5]
            lost = sorted(cursors - set(yielded))[:5]
            disorder = [(x, y) for x, y in itertools.pairwise(yielded) if y <= x][:3]
            violations.append(
                f"consumer {cid} key {key}: {len(yielded)} yielded of {len(cursors)} held; "
                f"twice {twice}, never {lost}, out of order {disorder}"
            )
    return violations


def check_replayable(arrivals: Sequence[Arrival], cid: str, ledger: Sequence[Entry]) -> list[str]:
    """A feed that can replay (Jetstream): every message the upstream SENT, on any socket, up to
    the last one delivered reaches the sink, nothing arrives that it never sent, and no gap
    marker is needed."""
    violations: list[str] = []
    mine = [a.record for a in arrivals if a.cid == cid]
    markers = [r for r in mine if r["kind"] != "data"]
    if markers:
        violations.append(f"replayable {cid}: {len(markers)} non-data records, first {markers[0]}")
    delivered = {r["cursor"] for r in mine if r["kind"] == "data"}
    if not delivered:
        return [*violations, f"replayable {cid}: nothing delivered"]
    last = max(delivered)
    sent = {e.cursor for e in ledger if e.kind == "data"}
    lost = sorted(c for c in sent if c <= last and c not in delivered)
    if lost:
        violations.append(
            f"replayable {cid}: {len(lost)} sent messages up to the last delivered ({last}) never "
            f"reached the sink, first {lost[:5]}"
        )
    invented = sorted(delivered - sent)
    if invented:
        violations.append(f"replayable {cid}: delivered but never sent: {invented[:5]}")
    return violations


def _message_key(message: dict[str, Any]) -> str:
    return json.dumps(message, sort_keys=True, separators=(",", ":"))


def check_not_replayable(
    arrivals: Sequence[Arrival], cid: str, ledger: Sequence[Entry], *, rate: float, t0_wall_ms: int
) -> list[str]:
    """A feed that cannot replay (Coinbase, keyed by product, trade ids consecutive per product):

    - per socket: every trade the upstream sent on a socket, up to the last trade of its product
      delivered from that socket, is delivered (the records between two socket markers are
      traced to the one socket that was sent all of them, by their whole content, `time`
      included);
    - nothing is delivered that no socket was sent;
    - every trade id missing from the sink (per product, between its first and last delivered)
      lies inside a gap marker placed before the next trade of the product in arrival order:
      a keyed marker (`key` = product) whose from_cursor/to_cursor bound the hole, or a marker of
      the whole connection (connect/takeover/reconnect/idle) whose from_cursor (the `{product:
      trade_id}` map it resumed from) is at or below the trade before the hole, and whose until_ms
      is no earlier than the time the last missing trade existed upstream.
    """
    violations: list[str] = []
    mine = [a.record for a in arrivals if a.cid == cid]
    sent_by: dict[str, list[int]] = defaultdict(list)  # message -> sockets that sent it
    per_socket: dict[tuple[int, str], list[int]] = defaultdict(list)  # (socket, product) -> ids sent
    for entry in ledger:
        if entry.kind == "data":
            sent_by[_message_key(entry.message)].append(entry.conn)
            per_socket[(entry.conn, str(entry.key))].append(int(entry.cursor))
    opened = {e.conn: e.t_ms for e in ledger if e.kind == "open"}
    delivered: dict[str, set[int]] = defaultdict(set)
    last_from: dict[tuple[int, str], int] = {}
    for run in socket_runs(mine):
        candidates: set[int] | None = None
        for record in run:
            product, trade = str(record["key"]), int(record["cursor"])
            delivered[product].add(trade)
            sockets = set(sent_by.get(_message_key(record["data"]), ()))
            if not sockets:
                violations.append(f"not-replayable {cid}: delivered but never sent: {product} {trade}")
                continue
            candidates = sockets if candidates is None else candidates & sockets
        if not candidates:
            if candidates is not None:
                violations.append(
                    f"not-replayable {cid}: the run from epoch {run[0]['epoch']} seq {run[0]['seq']} "
                    "mixes messages that no one socket was sent"
                )
            continue
        # One message sent to two sockets in the same millisecond (a paused owner's socket is
        # still open upstream while its successor subscribes) has the same content on both: the
        # run is the latest of them opened before the run's first record arrived.
        first_ms = int(run[0]["received_at_ms"])
        conn = max(candidates, key=lambda c: (opened.get(c, 0) <= first_ms, opened.get(c, 0)))
        for record in run:
            product, trade = str(record["key"]), int(record["cursor"])
            last_from[(conn, product)] = max(trade, last_from.get((conn, product), trade))
    for (conn, product), last in sorted(last_from.items()):
        unsent = [t for t in per_socket[(conn, product)] if t <= last and t not in delivered[product]]
        if unsent:
            violations.append(
                f"not-replayable {cid}: socket {conn} was sent {product} trades {unsent[:5]} (of "
                f"{len(unsent)}) before its last delivered one ({last}), and they never arrived"
            )
    # Every hole bounded by a marker, in arrival order.
    last_of: dict[str, int] = {}
    markers_since: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in mine:
        if record["kind"] == "gap":
            for product in {*last_of, *delivered}:
                markers_since[product].append(record["data"])
            continue
        if record["kind"] != "data":
            continue
        product, trade = str(record["key"]), int(record["cursor"])
        before = last_of.get(product)
        if before is not None and trade > before + 1:
            covering = [
                m for m in markers_since[product] if _covers(m, product, before, trade, rate, t0_wall_ms)
            ]
            if not covering:
                violations.append(
                    f"not-replayable {cid}: {product} trades {before + 1}..{trade - 1} missing with no "
                    f"gap marker bounding them (markers since: {markers_since[product][:3]})"
                )
        if before is None or trade > before:
            last_of[product] = trade
            markers_since[product] = []
    return violations


def socket_runs(records: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The data records of a feed that cannot replay, cut into one run per socket: a socket's
    records start after its marker of the whole connection (connect, takeover, reconnect, idle:
    docs/design.md §4.3), and never span two epochs."""
    runs: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    epoch: Any = None
    for record in records:
        starts = record["kind"] == "gap" and record["data"].get("key") is None
        if starts or record["epoch"] != epoch:
            if current:
                runs.append(current)
            current = []
            epoch = record["epoch"]
        if record["kind"] == "data":
            current.append(record)
    if current:
        runs.append(current)
    return runs


def _covers(
    marker: dict[str, Any], product: str, before: int, after: int, rate: float, t0_wall_ms: int
) -> bool:
    """Does this gap marker bound the hole between trade `before` and trade `after` of `product`?"""
    key = marker.get("key")
    if key is not None:
        low, high = marker.get("from_cursor"), marker.get("to_cursor")
        return (
            key == product
            and isinstance(low, int)
            and isinstance(high, int)
            and low <= before
            and high >= after
        )
    since = marker.get("from_cursor")
    if isinstance(since, dict) and isinstance(since.get(product), int) and since[product] > before:
        return False
    until = marker.get("until_ms")
    existed_ms = t0_wall_ms + (after - 1 - TRADE_ID_BASE) * 1000 / rate
    return isinstance(until, int) and existed_ms <= until + TAPE_SLACK_MS


def drop_one(arrivals: Sequence[Arrival], pick: Callable[[Arrival], bool]) -> tuple[list[Arrival], Arrival]:
    """A copy of the sink's output without the first line `pick` chooses (a negative control)."""
    for index, arrival in enumerate(arrivals):
        if pick(arrival):
            return [*arrivals[:index], *arrivals[index + 1 :]], arrival
    raise AssertionError("no line to drop for the negative control")


def move_late(arrivals: Sequence[Arrival], pick: Callable[[Arrival], bool]) -> list[Arrival]:
    """A copy in which the line `pick` chooses is written again at the end of its file, after
    everything else the tailer saw (a deposed owner's late write)."""
    chosen = next(a for a in arrivals if pick(a))
    last_read = max(a.seen for a in arrivals)
    lines = max(a.line for a in arrivals if a.file == chosen.file)
    late = replace(chosen, line=lines + 1, seen=last_read + 2, unseen=last_read + 1)
    return [*arrivals, late]
