"""The sink contract (docs/design.md §5): at-least-once, and `write` returns only once durable."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from leaseworker.records import SinkRecord

Validity = Callable[[], bool]
"""Asked immediately before bytes leave for the sink: False means the lease is gone (§2d)."""


def always_valid() -> bool:
    return True


class SinkError(Exception):
    """The sink did not accept the whole batch.

    `accepted` is the length of the batch's leading run that the sink did durably accept (0 when
    nothing is known to have landed): the caller may advance delivery by exactly that prefix.
    `permanent`: the record after that prefix can never be accepted (a record over the sink's
    size limit), so retrying it changes nothing; the caller counts it as a failure at that
    position (docs/design.md §4.4, L3) rather than resubscribing forever.
    """

    def __init__(self, message: str, *, accepted: int = 0, permanent: bool = False) -> None:
        super().__init__(message)
        self.accepted = accepted
        self.permanent = permanent


def writes_at_once(sink: object) -> bool:
    """Whether `sink.write` never suspends: it asks `valid` and hands its bytes over (or raises)
    within the call, so nothing can leave after the lease and no timer needs to bound it. A sink
    says so with a true `writes_at_once` attribute; a sink without one is timed."""
    return getattr(sink, "writes_at_once", False) is True


class Sink(Protocol):
    async def write(self, records: Sequence[SinkRecord], *, valid: Validity = always_valid) -> None:
        """Accept `records` durably, or raise SinkError. Only after it returns may the
        caller advance the checkpoint past these records. `valid` is checked right before each
        request or syscall that could make records visible; once it says False, nothing more
        may be sent and SinkError is raised."""

    async def close(self) -> None:
        """Flush anything buffered and release resources."""
