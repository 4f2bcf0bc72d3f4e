"""A local fleet: DynamoDB Local, an SQS endpoint, the seqfeed/1 feed and N worker processes; with
`replays=True` also local replays of real feeds (Jetstream, Coinbase) for generic/1 connections.

Every process is a child started in its own session and stopped by pid. The fleet is what
`leaseworker local up` runs and what the system tests drive (kill, pause, terminate).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aioboto3

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.vocabulary import WORKER_KEY_PREFIX
from leaseworker.settings import DEFAULT_TABLE, Settings
from leaseworker_dev.local.admin_loop import AdminLoop
from leaseworker_dev.local.invariants import Delivered, read_events, read_sink_arrivals, resubscribed_after
from leaseworker_dev.local.replays import DEMO_FEEDS, GENERIC, DemoFeed, compact, demo_config, start_replay
from leaseworker_dev.local.services import (
    LOCAL_CREDENTIALS,
    ManagedProcess,
    ServiceError,
    spawn,
    start_dynamodb_local,
    start_moto_server,
)
from leaseworker_dev.local.stream import read_arrivals_sync

TABLE = DEFAULT_TABLE  # the worker's default table name

_WORKER = Settings(worker_id="defaults")  # the worker's own defaults
WORKER_ENTRY: tuple[str, ...] = ("leaseworker", "run")  # `python -m leaseworker run`: the product's command


@dataclass(frozen=True)
class Timings:
    """Lease timings for the fleet's workers (environment values, docs/design.md §7). The
    defaults are the worker's own (Settings), but for a shorter shutdown grace on a laptop."""

    lease_seconds: float = _WORKER.lease_seconds
    heartbeat_seconds: float = _WORKER.heartbeat_seconds
    reconcile_seconds: float = _WORKER.reconcile_seconds
    checkpoint_seconds: float = _WORKER.checkpoint_seconds
    max_clock_skew_ms: int = _WORKER.max_clock_skew_ms
    metrics_seconds: float = _WORKER.metrics_seconds
    shutdown_grace_seconds: float = 10.0

    def env(self) -> dict[str, str]:
        return {
            "LEASE_SECONDS": str(self.lease_seconds),
            "HEARTBEAT_SECONDS": str(self.heartbeat_seconds),
            "RECONCILE_SECONDS": str(self.reconcile_seconds),
            "CHECKPOINT_SECONDS": str(self.checkpoint_seconds),
            "MAX_CLOCK_SKEW_MS": str(self.max_clock_skew_ms),
            "METRICS_SECONDS": str(self.metrics_seconds),
            "SHUTDOWN_GRACE_SECONDS": str(self.shutdown_grace_seconds),
        }


FAST = Timings(
    lease_seconds=3.0,
    heartbeat_seconds=1.0,
    reconcile_seconds=1.0,
    checkpoint_seconds=1.0,
    max_clock_skew_ms=200,
    metrics_seconds=2.0,
    shutdown_grace_seconds=10.0,
)


@dataclass
class WorkerProcess:
    name: str
    process: ManagedProcess
    started_at: float = field(default_factory=time.time)

    @property
    def pid(self) -> int:
        return self.process.pid


class Fleet:
    """Start, fault and stop a local fleet. Use as a context manager: exit stops everything."""

    def __init__(
        self,
        root: Path,
        *,
        timings: Timings = FAST,
        feed_rate: float = 20.0,
        with_sqs: bool = True,
        max_connections: int | None = None,
        sink: str | None = None,
        lease_mode: str | None = None,
        kinesis_stream: str | None = None,
        replays: bool = False,
    ) -> None:
        """`kinesis_stream`: deliver into a Kinesis stream of one shard on the fleet's moto
        server instead of files, so that one arbiter (the shard) orders every record.
        `replays`: also start the real feeds' local replays (leaseworker_dev.local.replays), so that
        `add_demo_feeds` can add generic/1 connections beside the seqfeed/1 ones."""
        self.root = root
        self.lease_mode = lease_mode
        self.kinesis_stream = kinesis_stream
        self.timings = timings
        self.feed_rate = feed_rate
        self.with_sqs = with_sqs
        self.max_connections = max_connections
        self.sink_dir = root / "sink"
        self.sink = f"kinesis:{kinesis_stream}" if kinesis_stream else sink or f"file:{self.sink_dir}"
        self.logs = root / "logs"
        self.feed_log = root / "feed-sessions.jsonl"
        self.dynamodb: ManagedProcess | None = None
        self.moto: ManagedProcess | None = None
        self.feed: ManagedProcess | None = None
        self.feed_url = ""
        self.with_replays = replays
        self.replays: dict[str, ManagedProcess] = {}  # feed name -> its replay process
        self.replay_urls: dict[str, str] = {}  # feed name -> its ws URL
        self.queue_url: str | None = None
        self.workers: dict[str, WorkerProcess] = {}
        self._counter = 0
        self._admin_loop: AdminLoop | None = None

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Fleet:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self.dynamodb = start_dynamodb_local(log_path=self.logs / "dynamodb-local.log")
        if self.with_sqs or self.kinesis_stream:
            self.moto = start_moto_server(log_path=self.logs / "moto.log")
        if self.with_sqs:
            self.queue_url = self._create_queue()
        if self.kinesis_stream:
            self._create_stream(self.kinesis_stream)
        self._start_feed()
        if self.with_replays:
            for demo in DEMO_FEEDS:
                if demo.feed not in self.replays:
                    process, url = start_replay(demo, logs=self.logs, session_log=self.replay_log(demo.feed))
                    self.replays[demo.feed], self.replay_urls[demo.feed] = process, url
        self._admin(lambda admin: admin.create_table())

    def stop(self) -> None:
        """Stop the workers, then the services: each one whatever happened to those before it
        (an error is raised once every step has run)."""
        with contextlib.ExitStack() as steps:  # runs its callbacks last in, first out
            for service in (self.dynamodb, self.moto, self.feed, *reversed(self.replays.values())):
                if service is not None:
                    steps.callback(service.stop)
            steps.callback(self._close_admin)
            for worker in reversed(self.workers.values()):
                steps.callback(self._stop_worker, worker)

    def _stop_worker(self, worker: WorkerProcess) -> None:
        if worker.process.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGCONT)  # the worker child too
        worker.process.stop(timeout=self.timings.shutdown_grace_seconds + 2)

    def _close_admin(self) -> None:
        if self._admin_loop is not None:
            self._admin_loop.close()
            self._admin_loop = None

    def children(self) -> list[ManagedProcess]:
        services = [s for s in (self.dynamodb, self.moto, self.feed, *self.replays.values()) if s is not None]
        return services + [w.process for w in self.workers.values()]

    # ------------------------------------------------------------------ services

    @property
    def endpoint(self) -> str:
        assert self.dynamodb is not None
        return self.dynamodb.url

    def env(self) -> dict[str, str]:
        """The environment a worker or a CLI command needs to act on this fleet."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "OTEL_"))}
        env.update(LOCAL_CREDENTIALS)
        env.update(self.timings.env())
        env.update({"TABLE_NAME": TABLE, "AWS_ENDPOINT_URL_DYNAMODB": self.endpoint})
        if self.moto is not None:
            env["AWS_ENDPOINT_URL_SQS"] = self.moto.url
            env["AWS_ENDPOINT_URL_KINESIS"] = self.moto.url
        if self.queue_url:
            env["NOTIFY_QUEUE_URL"] = self.queue_url
        if self.max_connections:
            env["MAX_CONNECTIONS"] = str(self.max_connections)
        if self.lease_mode:
            env["LEASE_MODE"] = self.lease_mode
        env["SINK"] = self.sink
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _create_queue(self) -> str:
        assert self.moto is not None

        async def create(endpoint: str) -> str:
            async with aioboto3.Session().client(
                "sqs",
                endpoint_url=endpoint,
                region_name="us-east-1",
                aws_access_key_id="local",
                aws_secret_access_key="local",
            ) as sqs:
                return (await sqs.create_queue(QueueName="leaseworker-notify"))["QueueUrl"]

        return asyncio.run(create(self.moto.url))

    def _create_stream(self, name: str) -> None:
        assert self.moto is not None

        async def create(endpoint: str) -> None:
            async with aioboto3.Session().client(
                "kinesis",
                endpoint_url=endpoint,
                region_name="us-east-1",
                aws_access_key_id="local",
                aws_secret_access_key="local",
            ) as kinesis:
                await kinesis.create_stream(StreamName=name, ShardCount=1)

        asyncio.run(create(self.moto.url))

    def arrivals(self) -> list[Delivered]:
        """Every record in the order the fleet's one arbiter received it: the Kinesis shard's
        order with a stream, else each sink file's order merged by receipt time."""
        if self.kinesis_stream:
            assert self.moto is not None
            return read_arrivals_sync(self.moto.url, self.kinesis_stream)
        return read_sink_arrivals(self.sink_dir)

    def _start_feed(self) -> None:
        argv = [
            sys.executable,
            "-m",
            "leaseworker_dev.feed",
            "--port",
            "0",
            "--rate",
            str(self.feed_rate),
            "--session-log",
            str(self.feed_log),
        ]
        out = self.logs / "feed.out"
        process = spawn("feed", argv, port=0, log_path=out)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if not process.alive():
                raise ServiceError(f"the feed exited; see {out}")
            for line in out.read_text().splitlines():
                if line.startswith('{"feed"'):
                    self.feed_url = json.loads(line)["feed"]
                    process.port = int(self.feed_url.rsplit(":", 1)[1])
                    self.feed = process
                    return
            time.sleep(0.05)
        process.stop()
        raise ServiceError("the feed did not start within 15 s")

    # ------------------------------------------------------------------ connections

    def url_for(self, connection_id: str, **query: str) -> str:
        base = f"{self.feed_url}/feeds/{connection_id}"
        return base + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")

    def add_connections(self, ids: list[str], **query: str) -> None:
        self._admin(lambda admin: _add_all(admin, [(cid, self.url_for(cid, **query)) for cid in ids]))

    def replay_log(self, feed: str) -> Path:
        """A replay's session log (the seqfeed/1 feed's format: leaseworker_dev.local.replays)."""
        return self.root / f"replay-{feed}-sessions.jsonl"

    def session_logs(self) -> list[Path]:
        """Every upstream's session log: the seqfeed/1 feed's, then each replay's."""
        return [self.feed_log, *(self.replay_log(feed) for feed in self.replays)]

    def add_demo_feeds(self, feeds: tuple[DemoFeed, ...] = DEMO_FEEDS) -> list[DemoFeed]:
        """Add the generic/1 connections of the mixed fleet, each a preset against its replay."""
        added = [feed for feed in feeds if feed.feed in self.replay_urls]
        for feed in added:
            self.add_generic(feed.connection_id, feed.preset, demo_config(feed, self.replay_urls[feed.feed]))
        return added

    def add_generic(self, connection_id: str, preset: str | None, config: dict[str, Any]) -> None:
        url = str(config["connect"]["url"])
        self._admin(
            lambda admin: admin.add(
                connection_id, url, protocol=GENERIC, protocol_config=compact(config), preset=preset
            )
        )

    def add_connection(self, connection_id: str, url: str) -> None:
        self._admin(lambda admin: admin.add(connection_id, url))

    def list_connections(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._admin(lambda admin: admin.list())
        return result

    def stop_connection(self, connection_id: str) -> None:
        self._admin(lambda admin: admin.stop(connection_id))

    def _admin(self, action: Any) -> Any:
        """Run `action(admin)` on the fleet's one long-lived table client (any thread)."""
        if self._admin_loop is None:
            self._admin_loop = AdminLoop(self.endpoint, TABLE)
        return self._admin_loop.call(action)

    # ------------------------------------------------------------------ workers

    def start_worker(
        self,
        name: str | None = None,
        *,
        extra_env: dict[str, str] | None = None,
        entry: tuple[str, ...] = WORKER_ENTRY,
    ) -> WorkerProcess:
        """Start a worker as `python -m <entry>`: `leaseworker run` unless the chaos runner starts
        its negative-control entry point (chaos/unsafe_worker.py)."""
        self._counter += 1
        name = name or f"w{self._counter}"
        env = self.env()
        env["WORKER_ID"] = name
        env["LEASEWORKER_HEALTH_FILE"] = str(self.root / "health" / f"{name}.json")
        env.update(extra_env or {})
        argv = [sys.executable, "-m", *entry]
        # If this process dies without stopping the fleet, its table and feed die with it: the
        # worker goes at once too (its child dies with its supervisor), no handoff to wait for.
        process = spawn(
            f"worker {name}",
            argv,
            port=0,
            log_path=self.logs / f"{name}.log",
            env=env,
            death_signal=signal.SIGKILL,
        )
        worker = WorkerProcess(name, process)
        self.workers[name] = worker
        return worker

    def signal(self, name: str, signum: int) -> float:
        """Send `signum` to a worker's process group (its supervisor and the worker child, in their
        own session): SIGSTOP pauses both, SIGKILL is a host-like death. Returns the wall-clock
        time (s) it was sent."""
        sent = time.time()
        os.killpg(self.workers[name].pid, signum)
        return sent

    def signal_child(self, name: str, signum: int) -> float:
        """Send `signum` to the worker child alone, not its supervisor: SIGKILL is then a
        process death the supervisor sees (an OOM-like death, docs/design.md §2e)."""
        from leaseworker.supervisor.process import child_pids

        children = child_pids(self.workers[name].pid)
        if not children:
            raise ServiceError(f"worker {name} has no child process")
        sent = time.time()
        os.kill(children[0], signum)
        return sent

    def session(self, name: str) -> dict[str, Any] | None:
        """A worker's session item (`worker#<name>`) as plain values, or None."""

        async def read(admin: LeaseTableAdmin) -> dict[str, Any] | None:
            return await admin.raw_item(f"{WORKER_KEY_PREFIX}{name}")

        result: dict[str, Any] | None = self._admin(read)
        return result

    def wait_exit(self, name: str, timeout: float) -> int | None:
        try:
            return self.workers[name].process.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def leases(self) -> dict[str, tuple[str | None, int]]:
        """Each connection's current owner (None when free) and epoch."""
        return {
            str(item["connection_id"]): (item.get("lease_owner"), int(item.get("lease_epoch", 0)))
            for item in self.list_connections()
        }

    def resubscribed(
        self, ids: set[str], after_ms: int, before: dict[str, tuple[str | None, int]]
    ) -> dict[str, float]:
        """Seconds from `after_ms` until the feed saw each of `ids` subscribed at a higher epoch
        than in `before` (a `leases()` reading); connections not yet resubscribed are absent."""
        epochs = {cid: before[cid][1] for cid in ids}
        events = [event for log in self.session_logs() for event in read_events(log)]
        return resubscribed_after(events, ids, after_ms, min_epoch=epochs)


def poll_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll `predicate` until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


async def _add_all(admin: LeaseTableAdmin, pairs: list[tuple[str, str]]) -> None:
    for cid, url in pairs:
        await admin.add(cid, url)
