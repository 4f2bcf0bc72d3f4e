"""CloudWatch metrics as Embedded Metric Format (Powertools Metrics) for a long-running worker.

Powertools Metrics is built for Lambda: one flush per invocation, printed to stdout. A worker runs
for days, so this module aggregates between flushes and emits one EMF blob per METRICS_SECONDS
(docs/design.md §8):

- counters (`count`) are summed and emitted as one value per flush;
- observations (`observe`: seconds and lag) are emitted as a value array, at most
  `MAX_SAMPLES_PER_FLUSH` per metric per flush (a uniform reservoir sample beyond that; EMF and
  Powertools cap an array at 100 values, and Powertools would otherwise print a partial blob to
  stdout on its own);
- gauges (`set_gauge`: ActiveConnections) are last-value-wins and re-emitted on every flush even
  when unchanged, because autoscaling tracks their average and a missing datapoint is not a zero.

The blob carries exactly one dimension, the lowercase `service` that Powertools adds, valued
from POWERTOOLS_SERVICE_NAME (default "leaseworker"); the CDK alarms, dashboard and scaling policy
must use that dimension with the same value the stack sets in that variable.

Output goes to the given stream (default: the current `sys.stdout`, which the awslogs driver
ships to CloudWatch Logs, where EMF becomes metrics). Rather than `flush_metrics()`, which only
`print()`s and would need the process-global `contextlib.redirect_stdout`, `flush` uses Powertools'
own serialisation (`serialize_metric_set`) and writes the line itself: same JSON, no global state.

Everything runs on the event loop's thread; the class is not thread-safe.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from collections.abc import Callable
from enum import StrEnum
from typing import Literal, TextIO

from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit
from aws_lambda_powertools.metrics.functions import is_metrics_disabled

from leaseworker.observability.logging import get_logger

__all__ = [
    "DEFAULT_NAMESPACE",
    "DEFAULT_SERVICE",
    "MAX_SAMPLES_PER_FLUSH",
    "METRIC_KINDS",
    "METRIC_UNITS",
    "MetricName",
    "WorkerMetrics",
    "run_metrics_loop",
    "service_from_env",
]

log = get_logger(__name__)

SERVICE_NAME_ENV = "POWERTOOLS_SERVICE_NAME"
DEFAULT_SERVICE = "leaseworker"  # when POWERTOOLS_SERVICE_NAME is unset (the stack sets it)
DEFAULT_NAMESPACE = "Leaseworker"  # when neither CDK context nor POWERTOOLS_METRICS_NAMESPACE says otherwise
MAX_SAMPLES_PER_FLUSH = 99  # Powertools self-flushes (print) when one metric reaches 100 values


class MetricName(StrEnum):
    """The metric names of docs/design.md §8: a contract with the CDK alarms, dashboard and scaling."""

    ActiveConnections = "ActiveConnections"  # gauge, per worker; its average drives autoscaling
    LeasesAcquired = "LeasesAcquired"
    LeaseAcquireFailures = "LeaseAcquireFailures"  # errors and throttles, not lost races
    LeaseContention = "LeaseContention"  # lost races
    LeasesLost = "LeasesLost"
    SelfFenced = "SelfFenced"
    OrphansSeen = "OrphansSeen"
    TakeoverSeconds = "TakeoverSeconds"
    TakeoversByFence = "TakeoversByFence"  # claimed from a fenced session (supervisor or observer)
    TakeoversByExpiry = "TakeoversByExpiry"  # claimed after a connection-mode lease expired
    HandoffSeconds = "HandoffSeconds"
    MessagesDelivered = "MessagesDelivered"
    SinkErrors = "SinkErrors"
    Reconnects = "Reconnects"
    ProtocolErrors = "ProtocolErrors"
    ReplaysDropped = "ReplaysDropped"  # overlapping replay frames (seq <= last delivered), §4.5
    CheckpointLagSeq = "CheckpointLagSeq"
    # The audit (worker/audit.py) found the table and our registry disagreeing, and repaired it:
    # a bug in our code or a lost DynamoDB reply. Any repair is worth an operator's look.
    LeasesRepaired = "LeasesRepaired"
    GapsMarked = "GapsMarked"  # gap markers delivered: holes a feed that cannot replay could not avoid
    GapSeconds = "GapSeconds"  # each marker's known width (until_ms - since_ms), in seconds
    ConnectsDeferred = "ConnectsDeferred"  # connects that waited for their host's budget (worker/budget.py)
    BudgetWaitSeconds = "BudgetWaitSeconds"  # each deferred connect's wait for a token


MetricKind = Literal["counter", "observation", "gauge"]

#: Which recording method each metric takes; a mismatch is a programming error (ValueError).
METRIC_KINDS: dict[MetricName, MetricKind] = {
    MetricName.ActiveConnections: "gauge",
    MetricName.LeasesAcquired: "counter",
    MetricName.LeaseAcquireFailures: "counter",
    MetricName.LeaseContention: "counter",
    MetricName.LeasesLost: "counter",
    MetricName.SelfFenced: "counter",
    MetricName.OrphansSeen: "counter",
    MetricName.TakeoverSeconds: "observation",
    MetricName.TakeoversByFence: "counter",
    MetricName.TakeoversByExpiry: "counter",
    MetricName.HandoffSeconds: "observation",
    MetricName.MessagesDelivered: "counter",
    MetricName.SinkErrors: "counter",
    MetricName.Reconnects: "counter",
    MetricName.ProtocolErrors: "counter",
    MetricName.GapsMarked: "counter",
    MetricName.GapSeconds: "observation",
    MetricName.ConnectsDeferred: "counter",
    MetricName.BudgetWaitSeconds: "observation",
    MetricName.ReplaysDropped: "counter",
    MetricName.CheckpointLagSeq: "observation",
    MetricName.LeasesRepaired: "counter",
}

METRIC_UNITS: dict[MetricName, MetricUnit] = {
    name: MetricUnit.Seconds if name.endswith("Seconds") else MetricUnit.Count for name in MetricName
}


class _Reservoir:
    """A uniform sample of at most `size` values from a stream (Vitter's algorithm R)."""

    __slots__ = ("seen", "size", "values")

    def __init__(self, size: int) -> None:
        self.size = size
        self.seen = 0
        self.values: list[float] = []

    def add(self, value: float) -> None:
        self.seen += 1
        if len(self.values) < self.size:
            self.values.append(value)
            return
        slot = random.randrange(self.seen)  # sampling, not security
        if slot < self.size:
            self.values[slot] = value


def service_from_env() -> str:
    """The `service` dimension: POWERTOOLS_SERVICE_NAME, as Powertools itself reads it, else the default."""
    return os.environ.get(SERVICE_NAME_ENV) or DEFAULT_SERVICE


class WorkerMetrics:
    """Aggregates the worker's metrics and emits one EMF blob per `flush()`.

    `service` (the dimension's value) defaults to POWERTOOLS_SERVICE_NAME, read once here.
    """

    def __init__(self, *, namespace: str, service: str | None = None, stream: TextIO | None = None) -> None:
        self.namespace = namespace
        self.service = service or service_from_env()
        self._stream = stream
        self._counters: dict[MetricName, float] = {}
        self._samples: dict[MetricName, _Reservoir] = {}
        self._gauges: dict[MetricName, float] = {}
        self._totals: dict[MetricName, float] = {
            name: 0.0 for name, kind in METRIC_KINDS.items() if kind == "counter"
        }

    def count(self, name: MetricName, value: float = 1) -> None:
        """Add `value` to a counter (summed until the next flush)."""
        self._check(name, "counter")
        self._counters[name] = self._counters.get(name, 0.0) + value
        self._totals[name] += value

    def observe(self, name: MetricName, value: float) -> None:
        """Record one observation (seconds or a sequence lag); each one is a datapoint."""
        self._check(name, "observation")
        reservoir = self._samples.get(name)
        if reservoir is None:
            reservoir = self._samples[name] = _Reservoir(MAX_SAMPLES_PER_FLUSH)
        reservoir.add(value)

    def set_gauge(self, name: MetricName, value: float) -> None:
        """Set a gauge; the last value wins and is emitted on every flush from now on."""
        self._check(name, "gauge")
        self._gauges[name] = value

    def totals(self) -> dict[str, float]:
        """Counters summed since start, plus the gauges' current values (for local views and tests)."""
        out = {str(name): value for name, value in self._totals.items()}
        out.update({str(name): value for name, value in self._gauges.items()})
        return out

    def flush(self) -> None:
        """Emit one EMF line with everything recorded since the last flush, plus the gauges.

        Writes nothing when nothing was recorded and no gauge is set. Never raises: an error is
        logged and that interval's data is dropped (metrics must never take the worker down).
        """
        counters, samples = self._counters, self._samples
        self._counters, self._samples = {}, {}
        if not counters and not samples and not self._gauges:
            return
        try:
            emf = EphemeralMetrics(namespace=self.namespace, service=self.service)
            for name, total in counters.items():
                emf.add_metric(name=name.value, unit=METRIC_UNITS[name], value=total)
            for name, reservoir in samples.items():
                for value in reservoir.values:
                    emf.add_metric(name=name.value, unit=METRIC_UNITS[name], value=value)
            for name, value in self._gauges.items():
                emf.add_metric(name=name.value, unit=METRIC_UNITS[name], value=value)
            if is_metrics_disabled():  # POWERTOOLS_METRICS_DISABLED / POWERTOOLS_DEV, as flush_metrics
                return
            line = json.dumps(emf.serialize_metric_set(), separators=(",", ":"))
            stream = self._stream if self._stream is not None else sys.stdout
            stream.write(line + "\n")
            stream.flush()
        except Exception:
            log.exception("metrics flush failed; dropping this interval's metrics")

    @staticmethod
    def _check(name: MetricName, kind: MetricKind) -> None:
        if METRIC_KINDS[name] != kind:
            raise ValueError(f"metric {name} is a {METRIC_KINDS[name]}, not a {kind}")


async def run_metrics_loop(
    metrics: WorkerMetrics,
    *,
    interval: float,
    stop: asyncio.Event,
    sample: Callable[[], None] | None = None,
) -> None:
    """Every `interval` seconds: `sample()` (set gauges there), then `flush()`.

    Returns as soon as `stop` is set, without a final flush: shutdown flushes explicitly as its
    last step (docs/design.md §3, step 7), after release has recorded HandoffSeconds and friends.
    """
    if interval <= 0:
        raise ValueError(f"interval must be > 0, got {interval!r}")
    while True:
        try:
            async with asyncio.timeout(interval):
                await stop.wait()
            return
        except TimeoutError:
            pass
        if sample is not None:
            try:
                sample()
            except Exception:
                log.exception("metrics sample callback failed")
        metrics.flush()
