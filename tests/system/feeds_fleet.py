"""A small fleet for the real-feed system tests (test_feeds.py).

The fleet: a lease table (and an SQS queue for the hints) on the run's shared DynamoDB Local and
moto, the local replays of real feeds (leaseworker_dev.feed.replays) served from a thread of the test
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

The checks that judge the arrivals and the ledgers are in feeds_checks.py (`Arrival`,
`check_s1` and `check_seqs` are re-exported here for the other system tests that run this fleet).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import botocore.session

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.protocol.presets import expand
from leaseworker.supervisor.process import child_pids
from leaseworker_dev.feed.replays import Entry, ReplayServer
from leaseworker_dev.local.admin_loop import AdminLoop
from leaseworker_dev.local.fleet import Timings
from leaseworker_dev.local.services import LOCAL_CREDENTIALS
from tests.system.feeds_checks import Arrival, check_s1, check_seqs
from tests.system.procscan import MARKER_VAR

__all__ = ["Arrival", "FeedsFleet", "Replays", "SinkTailer", "Worker", "check_s1", "check_seqs", "wait_until"]

TAIL_INTERVAL_S = 0.005


# ----------------------------------------------------------------------------- the sink tailer


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

    def skip(self, name: str, frames: int) -> None:
        """Make replay `name` lose its next `frames` data frames (an upstream's own loss within a
        socket), on the replays' loop."""

        async def skip() -> None:
            self.servers[name].skip(frames)

        asyncio.run_coroutine_threadsafe(skip(), self._loop).result(10)

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
