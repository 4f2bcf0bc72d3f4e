"""Build the sink named by SINK (docs/design.md §5): `stdout | null | file:<dir> | kinesis:<stream>`."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Final

import aioboto3
from aiobotocore.config import AioConfig

from leaseworker.no_linger import NoLingerAIOHTTPSession
from leaseworker.settings import validate_sink
from leaseworker.sinks.base import Sink
from leaseworker.sinks.file import FileSink
from leaseworker.sinks.kinesis import KinesisSink
from leaseworker.sinks.null import NullSink
from leaseworker.sinks.stdout import StdoutSink

KINESIS_CONNECT_TIMEOUT_SECONDS: Final = 2.0
KINESIS_READ_TIMEOUT_SECONDS: Final = 5.0
# No SDK-level retry (docs/design.md §2d): KinesisSink owns the retry loop, asks valid() before every
# call and stops at its deadline. An SDK retry would resend a call on a fresh connection without
# asking, while the abandoned attempt may still be on its way. Set as `total_max_attempts` (attempts):
# botocore reads `max_attempts` as retries, and 1 there meant two attempts (review 2026-12-05, G).
KINESIS_MAX_ATTEMPTS: Final = 1
# Connections to Kinesis. Each session has at most one PutRecords in flight (its writes are
# sequential), and the event loop's CPU bounds the call rate: measured against moto, a call costs
# the client 1.3 ms of CPU with 1 record and 7.3 ms with 200 (JSON, base64, signing), so one loop
# makes at most ~770 calls/s. By Little's law, at ~50 ms per call in-region that is ~40 in
# flight; 128 connections bind only once calls take over ~165 ms. A write that waits for a
# connection sends nothing (safe) and counts against its deadline; a pool of MAX_CONNECTIONS
# (1000) would keep idle sockets to one endpoint for no throughput.
KINESIS_MAX_POOL_CONNECTIONS: Final = 128


def kinesis_client_config() -> AioConfig:
    """The Kinesis client's config: no SDK retry, a sized pool, sockets that close with RST."""
    return AioConfig(
        connect_timeout=KINESIS_CONNECT_TIMEOUT_SECONDS,
        read_timeout=KINESIS_READ_TIMEOUT_SECONDS,
        retries={"total_max_attempts": KINESIS_MAX_ATTEMPTS, "mode": "standard"},
        max_pool_connections=KINESIS_MAX_POOL_CONNECTIONS,
        http_session_cls=NoLingerAIOHTTPSession,
    )


async def open_sink(
    spec: str,
    *,
    worker_id: str,
    stack: contextlib.AsyncExitStack,
    session: aioboto3.Session,
    endpoint_url: str | None,
    region: str | None,
    kinesis_deadline_seconds: float = 10.0,
) -> Sink:
    """Open the sink for `spec`; its close() (and any client it needs) is registered on `stack`.

    Raises SettingsError (a ValueError, one line) for a malformed spec.
    """
    validate_sink(spec)
    kind, _, arg = spec.partition(":")
    sink: Sink
    if kind == "stdout":
        sink = StdoutSink()
    elif kind == "null":
        sink = NullSink()
    elif kind == "file":
        sink = FileSink(Path(arg), worker_id)
    else:  # kinesis, the only other kind validate_sink lets through
        config = kinesis_client_config()
        client = await stack.enter_async_context(
            session.client("kinesis", endpoint_url=endpoint_url, region_name=region, config=config)
        )
        sink = KinesisSink(client, arg, deadline_seconds=kinesis_deadline_seconds)
    # LIFO: the sink closes (flushes) before the client it writes through is torn down.
    stack.push_async_callback(sink.close)
    return sink
