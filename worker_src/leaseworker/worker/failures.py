"""`last_error` on the connection item: why a session is retrying, written at a bounded rate."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from leaseworker.clock import monotonic
from leaseworker.lease.errors import StoreError
from leaseworker.lease.model import Lease
from leaseworker.observability.logging import get_logger

logger = get_logger(__name__)

FAILURE_RECORD_INTERVAL_SECONDS = 5.0

RecordFailure = Callable[[Lease, str], Awaitable[bool]]


class FailureRecorder:
    """Writes `last_error`/`failures` on the item, conditioned on the lease, at a bounded rate."""

    def __init__(self, record: RecordFailure) -> None:
        self._record = record
        self._last = -FAILURE_RECORD_INTERVAL_SECONDS

    async def __call__(self, lease: Lease, reason: str) -> None:
        now = monotonic()
        if now - self._last < FAILURE_RECORD_INTERVAL_SECONDS:
            return
        self._last = now
        try:
            await self._record(lease, reason)
        except StoreError as error:
            logger.warning("could not record failure", extra={"error": str(error)})
