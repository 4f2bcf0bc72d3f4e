"""Build the sink named by SINK (DESIGN.md §5): `stdout | null | file:<dir> | kinesis:<stream>`."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Final

import aioboto3
from aiobotocore.config import AioConfig

from leaseworker.settings import validate_sink
from leaseworker.sinks.base import Sink
from leaseworker.sinks.file import FileSink
from leaseworker.sinks.kinesis import KinesisSink
from leaseworker.sinks.null import NullSink
from leaseworker.sinks.stdout import StdoutSink

KINESIS_CONNECT_TIMEOUT_SECONDS: Final = 2.0
KINESIS_READ_TIMEOUT_SECONDS: Final = 5.0
# Bounded SDK retries: KinesisSink owns the retry loop and its deadline; the SDK's own retries
# only smooth over single hiccups and cannot hold one call for long.
KINESIS_MAX_ATTEMPTS: Final = 3  # standard mode


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
        config = AioConfig(
            connect_timeout=KINESIS_CONNECT_TIMEOUT_SECONDS,
            read_timeout=KINESIS_READ_TIMEOUT_SECONDS,
            retries={"max_attempts": KINESIS_MAX_ATTEMPTS, "mode": "standard"},
        )
        client = await stack.enter_async_context(
            session.client("kinesis", endpoint_url=endpoint_url, region_name=region, config=config)
        )
        sink = KinesisSink(client, arg, deadline_seconds=kinesis_deadline_seconds)
    # LIFO: the sink closes (flushes) before the client it writes through is torn down.
    stack.push_async_callback(sink.close)
    return sink
