"""What the worker gives every session it starts: settings, the sink, metrics, tracing, and the
seams (references, connect budgets, how a socket is opened, the background closes)."""

from __future__ import annotations

from dataclasses import dataclass, field

from leaseworker.observability.metrics import WorkerMetrics
from leaseworker.observability.tracing import Tracing
from leaseworker.settings import Settings
from leaseworker.sinks.base import Sink
from leaseworker.worker.budget import ConnectBudgets
from leaseworker.worker.references import NoReferences, References
from leaseworker.worker.upstream import BackgroundCloses, SocketOpener, open_unless_stopped


@dataclass(frozen=True, slots=True)
class SessionDeps:
    settings: Settings
    sink: Sink
    metrics: WorkerMetrics
    tracing: Tracing
    references: References = field(default_factory=NoReferences)
    budgets: ConnectBudgets | None = None  # the fleet's connect budgets per host (worker/budget.py)
    # How a socket is opened: websockets in production; in-memory sockets in the simulation
    # (bench/simulator/dst), which runs the real sessions in virtual time.
    open_socket: SocketOpener = open_unless_stopped
    closes: BackgroundCloses = field(default_factory=BackgroundCloses)  # the worker's exit awaits them
