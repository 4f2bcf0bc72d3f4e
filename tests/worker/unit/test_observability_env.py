"""What the standard environment variables decide in telemetry (docs/design.md §7, §8): the sampler
(OTEL_TRACES_SAMPLER/_ARG), tracing on or off (OTEL_EXPORTER_OTLP_ENDPOINT) and the service name
(POWERTOOLS_SERVICE_NAME, the metrics' `service` dimension)."""

from __future__ import annotations

import io
import json

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from leaseworker.observability.metrics import MetricName, WorkerMetrics
from leaseworker.observability.tracing import SpanName, configure_tracing
from leaseworker.settings import load_settings

ROOT_SPANS = 50
PARENT_RATIO = "parentbased_traceidratio"  # what the stack sets


def exported_spans(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> int:
    for name in ("OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    exporter = InMemorySpanExporter()
    tracing = configure_tracing(None, exporter=exporter)
    for _ in range(ROOT_SPANS):
        with tracing.span(SpanName.LEASE_RECONCILE), tracing.span(SpanName.LEASE_ACQUIRE):
            pass
    tracing.shutdown()
    return len(exporter.get_finished_spans())


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, 2 * ROOT_SPANS),  # the SDK's default: parentbased_always_on
        ({"OTEL_TRACES_SAMPLER": "always_off"}, 0),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}, 0),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1"}, 2 * ROOT_SPANS),
        # What the stack sets, at the edges: a root not sampled takes its children with it.
        ({"OTEL_TRACES_SAMPLER": PARENT_RATIO, "OTEL_TRACES_SAMPLER_ARG": "0"}, 0),
        (
            {"OTEL_TRACES_SAMPLER": PARENT_RATIO, "OTEL_TRACES_SAMPLER_ARG": "1.0"},
            2 * ROOT_SPANS,
        ),
    ],
)
def test_sampling_follows_the_standard_otel_variables(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: int
) -> None:
    assert exported_spans(monkeypatch, env) == expected


def test_tracing_is_off_without_an_otlp_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    settings = load_settings({"OTEL_TRACES_SAMPLER": "always_on"})
    assert settings.otel_endpoint is None
    assert not configure_tracing(settings.otel_endpoint).enabled
    on = load_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    tracing = configure_tracing(on.otel_endpoint)
    assert tracing.enabled
    tracing.shutdown(timeout=1)


def test_the_trace_service_name_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    def service_of_spans() -> object:
        exporter = InMemorySpanExporter()
        tracing = configure_tracing(None, exporter=exporter)
        with tracing.span(SpanName.LEASE_ACQUIRE):
            pass
        tracing.shutdown()
        (span,) = exporter.get_finished_spans()
        return span.resource.attributes["service.name"]

    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("POWERTOOLS_SERVICE_NAME", raising=False)
    assert service_of_spans() == "leaseworker"
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "feeds-prod")
    assert service_of_spans() == "feeds-prod"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "otel-name")
    assert service_of_spans() == "otel-name"


def emitted_service(metrics: WorkerMetrics, stream: io.StringIO) -> tuple[str, list[list[str]]]:
    metrics.count(MetricName.LeasesAcquired)
    metrics.flush()
    blob = json.loads(stream.getvalue().splitlines()[-1])
    (directive,) = blob["_aws"]["CloudWatchMetrics"]
    return blob["service"], directive["Dimensions"]


def test_the_metrics_service_dimension_comes_from_powertools_service_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "feeds-prod")
    stream = io.StringIO()
    assert emitted_service(WorkerMetrics(namespace="N", stream=stream), stream) == (
        "feeds-prod",
        [["service"]],
    )
    monkeypatch.delenv("POWERTOOLS_SERVICE_NAME")
    stream = io.StringIO()
    assert emitted_service(WorkerMetrics(namespace="N", stream=stream), stream)[0] == "leaseworker"
