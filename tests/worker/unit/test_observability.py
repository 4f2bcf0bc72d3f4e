"""Observability: task-scoped log keys, EMF metrics as CloudWatch reads them, and OTLP traces."""

from __future__ import annotations

import asyncio
import http.server
import io
import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from leaseworker.observability.logging import (
    configure_logging,
    current_log_context,
    get_logger,
    log_context,
    logger,
    set_log_context,
)
from leaseworker.observability.metrics import (
    MAX_SAMPLES_PER_FLUSH,
    MetricName,
    WorkerMetrics,
    run_metrics_loop,
)
from leaseworker.observability.tracing import SpanName, configure_tracing

# ---------------------------------------------------------------- logging


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    configure_logging("DEBUG", stream)
    try:
        yield stream
    finally:
        configure_logging("INFO")


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


async def test_log_keys_are_scoped_to_their_task(log_stream: io.StringIO) -> None:
    log = get_logger("leaseworker.session")
    both_inside = asyncio.Barrier(2)

    async def session(connection_id: str, epoch: int) -> None:
        with log_context(connection_id=connection_id, epoch=epoch):
            await both_inside.wait()  # both contexts are live at once
            for n in range(5):
                log.info("delivered", n=n)
                await asyncio.sleep(0)  # interleave with the other task

    async with asyncio.TaskGroup() as group:
        group.create_task(session("feed-a", 1))
        group.create_task(session("feed-b", 7))
    logger.info("outside")

    records = lines(log_stream)
    inside = [r for r in records if r["message"] == "delivered"]
    assert len(inside) == 10
    # Interleaved: the tasks alternate line by line, so a leaked key would show.
    order = [r["connection_id"] for r in inside]
    assert all(a != b for a, b in itertools.pairwise(order)), order
    for record in inside:
        assert record["epoch"] == {"feed-a": 1, "feed-b": 7}[record["connection_id"]]
        assert record["service"] == "leaseworker"
        assert record["level"] == "INFO"
        assert record["name"] == "leaseworker.session"
    (outside,) = [r for r in records if r["message"] == "outside"]
    assert "connection_id" not in outside
    assert "epoch" not in outside


async def test_log_context_nests_inherits_and_restores(log_stream: io.StringIO) -> None:
    log = get_logger(__name__)
    with log_context(connection_id="feed-1", epoch=1):
        with log_context(epoch=2):
            log.info("nested")

        async def child() -> None:
            set_log_context(phase="child")  # lives in the child task's copy of the context only
            log.info("in child")

        await asyncio.create_task(child())
        log.info("after child")
        log.info("explicit", epoch=9)  # a key passed to the call wins over the context
    assert current_log_context() == {}

    by_message = {r["message"]: r for r in lines(log_stream)}
    assert (by_message["nested"]["connection_id"], by_message["nested"]["epoch"]) == ("feed-1", 2)
    assert by_message["in child"]["phase"] == "child"
    assert by_message["in child"]["epoch"] == 1
    assert "phase" not in by_message["after child"]
    assert by_message["explicit"]["epoch"] == 9


def test_level_filters_and_get_logger_is_cached(log_stream: io.StringIO) -> None:
    configure_logging("WARNING", log_stream)
    log = get_logger("leaseworker.lease")
    assert get_logger("leaseworker.lease") is log
    assert get_logger() is logger
    log.info("hidden")
    log.warning("shown")
    assert [r["message"] for r in lines(log_stream)] == ["shown"]


# ---------------------------------------------------------------- metrics


def emf_blobs(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def metric_defs(blob: dict[str, Any]) -> dict[str, str]:
    (directive,) = blob["_aws"]["CloudWatchMetrics"]
    return {m["Name"]: m["Unit"] for m in directive["Metrics"]}


def test_metric_names_match_the_design() -> None:
    assert all(m.name == m.value for m in MetricName)  # MetricName.SinkErrors, as the CDK spells it
    assert {m.value for m in MetricName} == {
        "ActiveConnections",
        "LeasesAcquired",
        "LeaseAcquireFailures",
        "LeaseContention",
        "LeasesLost",
        "SelfFenced",
        "OrphansSeen",
        "TakeoverSeconds",
        "HandoffSeconds",
        "MessagesDelivered",
        "SinkErrors",
        "Reconnects",
        "ProtocolErrors",
        "CheckpointLagSeq",
        # Added after docs/design.md §8's list (see the closing notes): takeovers by fence versus by
        # expiry (issue 10), and overlapping replays dropped (§4.5).
        "TakeoversByFence",
        "TakeoversByExpiry",
        "ReplaysDropped",
        # Issue 20: the audit's repairs; issue 21: gap markers (docs/design.md §4.3).
        "LeasesRepaired",
        "GapsMarked",
        "GapSeconds",
        # Issue 24: connects that waited for their host's fleet-wide budget, and how long.
        "ConnectsDeferred",
        "BudgetWaitSeconds",
    }


def test_flush_emits_one_emf_blob(capsys: pytest.CaptureFixture[str]) -> None:
    stream = io.StringIO()
    metrics = WorkerMetrics(namespace="LeaseworkerTest", service="svc-a", stream=stream)
    metrics.count(MetricName.MessagesDelivered)
    metrics.count(MetricName.MessagesDelivered, 4)
    metrics.count(MetricName.LeasesAcquired)
    metrics.observe(MetricName.TakeoverSeconds, 2.5)
    metrics.observe(MetricName.TakeoverSeconds, 3.0)
    metrics.observe(MetricName.CheckpointLagSeq, 12)
    metrics.set_gauge(MetricName.ActiveConnections, 3)
    metrics.set_gauge(MetricName.ActiveConnections, 5)  # last value wins

    metrics.flush()

    (blob,) = emf_blobs(stream)
    (directive,) = blob["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == "LeaseworkerTest"
    assert directive["Dimensions"] == [["service"]]
    assert blob["service"] == "svc-a"
    assert metric_defs(blob) == {
        "MessagesDelivered": "Count",
        "LeasesAcquired": "Count",
        "TakeoverSeconds": "Seconds",
        "CheckpointLagSeq": "Count",
        "ActiveConnections": "Count",
    }
    assert blob["MessagesDelivered"] == [5.0]
    assert blob["LeasesAcquired"] == [1.0]
    assert blob["TakeoverSeconds"] == [2.5, 3.0]
    assert blob["CheckpointLagSeq"] == [12.0]
    assert blob["ActiveConnections"] == [5.0]
    assert isinstance(blob["_aws"]["Timestamp"], int)
    assert capsys.readouterr().out == ""  # nothing leaks to stdout


def test_counts_reset_per_flush_gauge_repeats_totals_accumulate() -> None:
    stream = io.StringIO()
    metrics = WorkerMetrics(namespace="N", stream=stream)
    metrics.flush()
    assert stream.getvalue() == ""  # nothing recorded, no gauge: no blob

    metrics.count(MetricName.Reconnects, 2)
    metrics.set_gauge(MetricName.ActiveConnections, 4)
    metrics.flush()
    metrics.flush()  # nothing new: only the gauge
    metrics.count(MetricName.Reconnects)
    metrics.flush()

    first, second, third = emf_blobs(stream)
    assert first["service"] == "leaseworker"
    assert (first["Reconnects"], first["ActiveConnections"]) == ([2.0], [4.0])
    assert metric_defs(second) == {"ActiveConnections": "Count"}
    assert second["ActiveConnections"] == [4.0]
    assert third["Reconnects"] == [1.0]
    totals = metrics.totals()
    assert totals["Reconnects"] == 3
    assert totals["ActiveConnections"] == 4
    assert totals["SinkErrors"] == 0


def test_observations_are_capped_per_flush() -> None:
    stream = io.StringIO()
    metrics = WorkerMetrics(namespace="N", stream=stream)
    for lag in range(1000):
        metrics.observe(MetricName.CheckpointLagSeq, lag)
    metrics.flush()
    (blob,) = emf_blobs(stream)
    values = blob["CheckpointLagSeq"]
    assert len(values) == MAX_SAMPLES_PER_FLUSH
    assert set(values) <= {float(v) for v in range(1000)}


def test_wrong_kind_is_refused() -> None:
    metrics = WorkerMetrics(namespace="N", stream=io.StringIO())
    with pytest.raises(ValueError, match="gauge"):
        metrics.count(MetricName.ActiveConnections)
    with pytest.raises(ValueError, match="counter"):
        metrics.observe(MetricName.MessagesDelivered, 1)
    with pytest.raises(ValueError, match="observation"):
        metrics.set_gauge(MetricName.TakeoverSeconds, 1)


class BrokenStream(io.StringIO):
    def write(self, s: str) -> int:
        raise OSError("disk on fire")


def test_flush_never_raises(log_stream: io.StringIO) -> None:
    metrics = WorkerMetrics(namespace="N", stream=BrokenStream())
    metrics.count(MetricName.SinkErrors)
    metrics.flush()
    assert any("metrics flush failed" in r["message"] for r in lines(log_stream))
    assert metrics.totals()["SinkErrors"] == 1


async def test_metrics_loop_samples_and_flushes_periodically() -> None:
    stream = io.StringIO()
    metrics = WorkerMetrics(namespace="N", stream=stream)
    stop = asyncio.Event()
    samples = 0

    def sample() -> None:
        nonlocal samples
        samples += 1
        metrics.set_gauge(MetricName.ActiveConnections, samples)

    task = asyncio.create_task(run_metrics_loop(metrics, interval=0.05, stop=stop, sample=sample))
    await asyncio.sleep(0.33)
    stop.set()
    await asyncio.wait_for(task, timeout=1)

    blobs = emf_blobs(stream)
    assert 4 <= len(blobs) == samples <= 7
    assert [b["ActiveConnections"] for b in blobs] == [[float(n)] for n in range(1, samples + 1)]


async def test_metrics_loop_returns_promptly_on_stop() -> None:
    stream = io.StringIO()
    metrics = WorkerMetrics(namespace="N", stream=stream)
    stop = asyncio.Event()
    task = asyncio.create_task(run_metrics_loop(metrics, interval=60, stop=stop))
    await asyncio.sleep(0.05)
    started = time.monotonic()
    stop.set()
    await asyncio.wait_for(task, timeout=1)
    assert time.monotonic() - started < 0.1
    assert stream.getvalue() == ""  # no flush on stop: shutdown flushes explicitly


async def test_metrics_loop_survives_a_failing_sample() -> None:
    stream = io.StringIO()
    metrics = WorkerMetrics(namespace="N", stream=stream)
    metrics.count(MetricName.LeasesLost)
    stop = asyncio.Event()

    def sample() -> None:
        stop.set()
        raise RuntimeError("boom")

    await asyncio.wait_for(run_metrics_loop(metrics, interval=0.01, stop=stop, sample=sample), timeout=1)
    (blob,) = emf_blobs(stream)
    assert blob["LeasesLost"] == [1.0]


# ---------------------------------------------------------------- tracing


def test_tracing_off_is_a_cheap_noop() -> None:
    tracing = configure_tracing(None)
    assert not tracing.enabled
    with tracing.span(SpanName.LEASE_ACQUIRE, connection_id="x") as span:
        assert not span.is_recording()
        span.set_attribute("ignored", 1)
    started = time.perf_counter()
    for _ in range(100_000):
        with tracing.span("lease.renew_batch", leases=3):
            pass
    assert time.perf_counter() - started < 0.5  # ≈ 0.3 µs each; a real span costs ~20 µs
    tracing.shutdown()


async def test_tracing_on_records_spans_attributes_and_errors() -> None:
    exporter = InMemorySpanExporter()
    tracing = configure_tracing(None, service_name="lw-test", exporter=exporter)
    assert tracing.enabled

    with tracing.span(SpanName.LEASE_RECONCILE, candidates=2):
        with tracing.span(SpanName.LEASE_ACQUIRE, connection_id="feed-1", epoch=4, won=True):
            await asyncio.sleep(0)
        with pytest.raises(RuntimeError), tracing.span(SpanName.LEASE_CHECKPOINT, connection_id="feed-1"):
            raise RuntimeError("throttled")

    async def connect() -> None:
        with tracing.span(SpanName.SESSION_CONNECT, connection_id="feed-2"):
            await asyncio.sleep(10)

    task = asyncio.create_task(connect())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    tracing.shutdown()

    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"lease.reconcile", "lease.acquire", "lease.checkpoint", "session.connect"}
    acquire, reconcile = spans["lease.acquire"], spans["lease.reconcile"]
    assert dict(acquire.attributes or {}) == {"connection_id": "feed-1", "epoch": 4, "won": True}
    assert acquire.parent is not None and acquire.parent.span_id == reconcile.context.span_id
    assert acquire.resource.attributes["service.name"] == "lw-test"
    assert acquire.status.status_code is StatusCode.UNSET

    checkpoint = spans["lease.checkpoint"]
    assert checkpoint.status.status_code is StatusCode.ERROR
    (event,) = checkpoint.events
    assert event.name == "exception"
    assert (event.attributes or {})["exception.message"] == "throttled"

    connect_span = spans["session.connect"]
    assert connect_span.parent is None  # a fresh task outside the reconcile span
    assert connect_span.status.status_code is not StatusCode.ERROR  # cancellation is not an error


class _OtlpHandler(http.server.BaseHTTPRequestHandler):
    received: list[tuple[str, str, int]]

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        self.received.append((self.path, self.headers.get("Content-Type", ""), length))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_tracing_exports_over_otlp_http_on_shutdown() -> None:
    received: list[tuple[str, str, int]] = []
    handler = type("Handler", (_OtlpHandler,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        tracing = configure_tracing(f"http://127.0.0.1:{server.server_address[1]}/")
        with tracing.span(SpanName.LEASE_RENEW_BATCH, leases=10):
            pass
        assert received == []  # batched, not sent inline
        tracing.shutdown(timeout=5)
    finally:
        server.shutdown()
        server.server_close()
    assert len(received) == 1
    path, content_type, length = received[0]
    assert path == "/v1/traces"
    assert content_type == "application/x-protobuf"
    assert length > 0


def test_tracing_shutdown_is_bounded_when_the_collector_hangs() -> None:
    # A listening socket that never accepts: the connection opens, the response never comes.
    with socket.socket() as blackhole:
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(8)
        tracing = configure_tracing(f"http://127.0.0.1:{blackhole.getsockname()[1]}", export_timeout=10)
        with tracing.span(SpanName.LEASE_ACQUIRE):
            pass
        started = time.monotonic()
        tracing.shutdown(timeout=0.5)
        assert time.monotonic() - started < 1.0
