"""One simulated fleet: the real `Worker`s, on one virtual-time event loop, against the in-memory
DynamoDB and in-memory feeds, with the faults a schedule injects.

Real: everything `leaseworker run` builds below its clients (worker/main.py `coordination`, the
Worker and its loops, the sessions and their socket loop, the seqfeed/1 adapter, the sink
contract's validity check). Stand-ins: the DynamoDB client (bench/simulator/memory_dynamodb.py,
behind a faulty link), the sockets (upstream.py), the sink (sink.py), metrics written nowhere,
no SQS hints (reconcile and the peer watch are the paths), no supervisor (a kill takes the whole
process: no fence is written, takeover goes by the lease path). A pause holds every callback of
the worker's tasks on the loop (bench/simulator/clock.py `Process`), as SIGSTOP does.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import io
import random
import traceback
from dataclasses import dataclass, field

from bench.simulator.clock import PROCESS, Process, resume
from bench.simulator.dst.link import Link
from bench.simulator.dst.sink import Arrivals, RecordingSink
from bench.simulator.dst.upstream import Upstream
from bench.simulator.memory_dynamodb import MemoryDynamoDB
from bench.simulator.memory_table import Database
from leaseworker import clock
from leaseworker.clock import Clock
from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.vocabulary import MAX_ENTRIES_PER_ITEM
from leaseworker.notify import Notifier
from leaseworker.observability.metrics import WorkerMetrics
from leaseworker.observability.tracing import Tracing
from leaseworker.settings import LeaseMode, Settings
from leaseworker.worker.app import Worker
from leaseworker.worker.fenced import WorkerFenced
from leaseworker.worker.main import coordination
from leaseworker.worker.session_deps import SessionDeps

TABLE = "leases"
LATENCY = (0.002, 0.02)  # one DynamoDB round trip, seconds


class _Nowhere(io.StringIO):
    """Metrics are not the simulation's business: their lines go nowhere."""

    def write(self, text: str) -> int:
        return len(text)


@dataclass(frozen=True, slots=True)
class Timings:
    lease_seconds: float = 6.0
    heartbeat_seconds: float = 2.0
    reconcile_seconds: float = 2.0
    checkpoint_seconds: float = 2.0
    max_clock_skew_ms: int = 200


@dataclass
class SimWorker:
    settings: Settings
    link: Link
    sink: RecordingSink
    stop: asyncio.Event
    task: asyncio.Task[None]
    process: Process
    ended: str | None = None  # why its run ended: "stopped", "fenced", "killed", "crashed: ..."


class OffsetClock:
    """The run's virtual clock, its wall time moved by `offset` seconds (a host's clock error)."""

    def __init__(self, base: Clock, offset: float) -> None:
        self._base = base
        self._offset = offset

    def monotonic(self) -> float:
        return self._base.monotonic()

    def time(self) -> float:
        return self._base.time() + self._offset

    def time_ns(self) -> int:
        return self._base.time_ns() + round(self._offset * 1e9)


@dataclass
class Fleet:
    mode: str  # session, connection, or mixed: each worker draws its own
    rng: random.Random
    connections: int
    period: float
    timings: Timings = field(default_factory=Timings)
    database: Database = field(default_factory=Database)
    arrivals: Arrivals = field(default_factory=Arrivals)
    workers: dict[str, SimWorker] = field(default_factory=dict)
    clock_offsets: tuple[float, ...] = ()
    max_connections: int | None = None  # per worker (None: all, within one item's entries)
    id_prefix: str = "c"  # connection ids are the prefix and a number, zero-padded to `id_digits`
    id_digits: int = 3
    stops: list[tuple[str, float, float]] = field(default_factory=list)  # (connection, stopped, started)
    removed: set[str] = field(default_factory=set)
    operated: set[str] = field(default_factory=set)  # stopped or being removed by the operator now
    refusals: list[str] = field(default_factory=list)  # what the operator was refused for too long
    upstream: Upstream = field(init=False)
    _started: int = 0

    def __post_init__(self) -> None:
        self.database.create_table(TABLE)
        self.upstream = Upstream(self.ids, self.period)

    @property
    def ids(self) -> list[str]:
        width = max(self.id_digits, len(str(self.connections - 1)))
        return [f"{self.id_prefix}{n:0{width}d}" for n in range(self.connections)]

    async def add_connections(self) -> None:
        admin = self.admin()
        for cid in self.ids:
            await admin.add(cid, f"wss://upstream.sim/{cid}")

    def admin(self) -> LeaseTableAdmin:
        """An operator's CLI: it reaches DynamoDB whatever the workers' links suffer."""
        return LeaseTableAdmin(MemoryDynamoDB(self.database), TABLE)  # type: ignore[arg-type]

    def start_worker(self) -> str:
        self._started += 1
        worker_id = f"w{self._started}"
        t = self.timings
        mode: LeaseMode
        if self.mode == "mixed":
            mode = "session" if self.rng.random() < 0.5 else "connection"
        else:
            mode = "session" if self.mode == "session" else "connection"
        settings = Settings(
            table_name=TABLE,
            lease_mode=mode,
            lease_seconds=t.lease_seconds,
            heartbeat_seconds=t.heartbeat_seconds,
            reconcile_seconds=t.reconcile_seconds,
            checkpoint_seconds=t.checkpoint_seconds,
            max_clock_skew_ms=t.max_clock_skew_ms,
            metrics_seconds=60.0,
            shutdown_grace_seconds=10.0,
            max_connections=self.max_connections or min(MAX_ENTRIES_PER_ITEM, max(8, self.connections)),
            sink="null",
            worker_id=worker_id,
        )
        link = Link(MemoryDynamoDB(self.database), self.rng, LATENCY)
        sink = RecordingSink(self.arrivals, worker_id)
        deps = SessionDeps(
            settings=settings,
            sink=sink,
            metrics=WorkerMetrics(namespace="Sim", stream=_Nowhere()),
            tracing=Tracing(None),
            open_socket=self.upstream.opener(worker_id),
        )
        worker = Worker(
            coordination=coordination(link, settings),  # type: ignore[arg-type]
            deps=deps,
            notifier=Notifier(None, None),
        )
        stop = asyncio.Event()
        offsets = self.clock_offsets or (0.0,)
        offset = offsets[(self._started - 1) % len(offsets)]
        context = contextvars.copy_context()  # the worker's tasks read its own clock
        context.run(clock.install, OffsetClock(clock.current(), offset))
        process = Process()
        context.run(PROCESS.set, process)
        task = asyncio.get_running_loop().create_task(
            worker.run(stop), name=f"worker:{worker_id}", context=context
        )
        self.workers[worker_id] = SimWorker(settings, link, sink, stop, task, process)
        task.add_done_callback(functools.partial(self._ended, worker_id))
        return worker_id

    def _ended(self, worker_id: str, task: asyncio.Task[None]) -> None:
        worker = self.workers[worker_id]
        if worker.ended is not None:
            return
        if task.cancelled():
            worker.ended = "cancelled"
        elif isinstance(task.exception(), WorkerFenced):
            worker.ended = "fenced"
        elif (error := task.exception()) is not None:
            while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
                error = error.exceptions[0]  # the TaskGroup's one failure, not its wrapper
            frames = traceback.extract_tb(error.__traceback__)[-2:]
            where = "; ".join(f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}" for frame in frames)
            worker.ended = f"crashed: {type(error).__name__}: {error} ({where})"
        else:
            worker.ended = "stopped"

    def live(self) -> list[str]:
        return [w for w, worker in self.workers.items() if worker.ended is None]

    def kill(self, worker_id: str) -> None:
        """SIGKILL of the whole task: nothing it had in flight reaches DynamoDB, the sink or the
        upstream any more, and nothing of its shutdown runs."""
        worker = self.workers[worker_id]
        worker.ended = "killed"
        worker.link.dead = True
        worker.sink.cut = True
        self.upstream.cut(worker_id)
        worker.task.cancel()
        if worker.process.paused:  # SIGKILL ends a stopped process too
            resume(asyncio.get_running_loop(), worker.process)

    def pause(self, worker_id: str, seconds: float) -> None:
        """SIGSTOP, then SIGCONT after `seconds`: none of the worker's code runs in between, its
        sockets, DynamoDB calls and timers wait, and its clock goes on (clock.Process)."""
        process = self.workers[worker_id].process
        if process.paused:
            return
        process.paused = True
        loop = asyncio.get_running_loop()
        loop.call_later(seconds, resume, loop, process)

    def terminate(self, worker_id: str) -> None:
        """SIGTERM: the ordered shutdown of docs/design.md §3."""
        self.workers[worker_id].stop.set()

    def partition(self, worker_id: str, seconds: float) -> None:
        """DynamoDB unreachable from this worker for `seconds`; its sockets and sink still work."""
        link = self.workers[worker_id].link
        link.partitioned_until = asyncio.get_running_loop().time() + seconds
