"""OpenTelemetry traces (docs/design.md §8): SDK → OTLP/HTTP → the ADOT collector sidecar → X-Ray.

Tracing is off unless an OTLP endpoint is configured (OTEL_EXPORTER_OTLP_ENDPOINT, read by
settings). Off means `span()` returns one shared no-op context manager: no SDK objects, no clock
reads, no allocation per call beyond the keyword dict.

On, this module holds its own TracerProvider instead of installing the global one, so tests (and
libraries that instrument the global provider) never see our spans by accident, and several
configurations can coexist in one process. Spans still nest through OpenTelemetry's context,
which is a ContextVar: each asyncio task has its own current span.

Export runs on the BatchSpanProcessor's background thread with a short request timeout, so a dead
collector costs the event loop nothing. `shutdown()` blocks (force flush + provider shutdown) for
at most its timeout; from async code call it as `await asyncio.to_thread(tracing.shutdown)`.

Sampling is the SDK's own reading of the standard OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG
(the stack sets a parent-based ratio): the provider is built without a `sampler`, so nothing here
can override them. Unset, the SDK's default is parentbased_always_on.

The service name is OTEL_SERVICE_NAME when set (the SDK reads it), else POWERTOOLS_SERVICE_NAME,
else "leaseworker": the same name as the logs and the metrics' `service` dimension.

An exception leaving a span is recorded on it as an event and sets its status to ERROR.
Cancellation (a BaseException) is not an error and is not recorded.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from enum import StrEnum
from types import TracebackType

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from leaseworker.observability.logging import get_logger

__all__ = ["AttributeValue", "SpanName", "Tracing", "configure_tracing", "traces_url"]

log = get_logger(__name__)

AttributeValue = str | int | float | bool

EXPORT_TIMEOUT_SECONDS = 2.0  # per OTLP request; the collector is a sidecar on localhost
SCHEDULE_DELAY_MILLIS = 2000  # how long ended spans wait to be batched
SHUTDOWN_TIMEOUT_SECONDS = 5.0


class SpanName(StrEnum):
    """The spans the worker emits (docs/design.md §8)."""

    LEASE_ACQUIRE = "lease.acquire"
    LEASE_RENEW_BATCH = "lease.renew_batch"
    LEASE_RECONCILE = "lease.reconcile"
    SESSION_CONNECT = "session.connect"
    LEASE_CHECKPOINT = "lease.checkpoint"


class _NoopSpanContext(AbstractContextManager[trace.Span]):
    """The whole cost of a span when tracing is off: one shared object, nothing recorded."""

    __slots__ = ()

    def __enter__(self) -> trace.Span:
        return trace.INVALID_SPAN

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


_NOOP = _NoopSpanContext()


class Tracing:
    """Creates spans; a no-op when built without a provider."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("leaseworker") if provider is not None else None
        self._closed = False

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def span(self, name: str, **attributes: AttributeValue) -> AbstractContextManager[trace.Span]:
        """A span around a block (sync or async code): `with tracing.span("lease.acquire", n=3) as s:`.

        The yielded span accepts `set_attribute` etc.; when tracing is off it is a no-op span.
        """
        if self._tracer is None:
            return _NOOP
        return self._span(self._tracer, name, attributes)

    @staticmethod
    @contextmanager
    def _span(tracer: trace.Tracer, name: str, attributes: dict[str, AttributeValue]) -> Iterator[trace.Span]:
        with tracer.start_as_current_span(
            name, attributes=attributes, record_exception=True, set_status_on_exception=True
        ) as span:
            yield span

    def shutdown(self, timeout: float = SHUTDOWN_TIMEOUT_SECONDS) -> None:
        """Export what is pending and stop, blocking for at most `timeout` seconds. Never raises.

        The SDK's own timeouts are not all honoured (force_flush ignores its argument), so the
        work runs on a daemon thread that we stop waiting for at the deadline.
        """
        provider = self._provider
        if provider is None or self._closed:
            return
        self._closed = True

        def close() -> None:
            try:
                provider.force_flush(int(timeout * 1000))
                provider.shutdown()
            except Exception:
                log.exception("tracing shutdown failed")

        worker = threading.Thread(target=close, name="leaseworker-tracing-shutdown", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            log.warning("tracing shutdown timed out; pending spans dropped", timeout_seconds=timeout)


def traces_url(endpoint: str) -> str:
    """OTEL_EXPORTER_OTLP_ENDPOINT is a base URL; the OTLP/HTTP traces path is appended to it."""
    return endpoint.rstrip("/") + "/v1/traces"


def configure_tracing(
    endpoint: str | None,
    *,
    service_name: str | None = None,
    exporter: SpanExporter | None = None,
    export_timeout: float = EXPORT_TIMEOUT_SECONDS,
) -> Tracing:
    """Tracing for the worker: off (no-op spans) when neither `endpoint` nor `exporter` is given.

    `exporter` replaces the OTLP exporter (tests pass an InMemorySpanExporter). `service_name`
    defaults to the environment's (see the module docstring).
    """
    if exporter is None:
        if not endpoint:
            return Tracing(None)
        exporter = OTLPSpanExporter(endpoint=traces_url(endpoint), timeout=export_timeout)
    # No atexit hook: shutdown is explicit and bounded (docs/design.md §3, step 7). The SDK's hook
    # would block interpreter exit for up to 30 s more when the collector is unreachable.
    service_name = service_name or _service_name_from_env()
    # No `sampler=`: the SDK then reads OTEL_TRACES_SAMPLER(_ARG) itself (docs/design.md §7).
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}), shutdown_on_exit=False)
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter,
            schedule_delay_millis=SCHEDULE_DELAY_MILLIS,
            export_timeout_millis=export_timeout * 1000,
        )
    )
    log.info("tracing on", otlp_endpoint=endpoint or "(custom exporter)", service_name=service_name)
    return Tracing(provider)


def _service_name_from_env() -> str:
    return os.environ.get("OTEL_SERVICE_NAME") or os.environ.get("POWERTOOLS_SERVICE_NAME") or "leaseworker"
