"""The sink contract (DESIGN.md §5): at-least-once, and `write` returns only once durable."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from leaseworker.records import SinkRecord


class SinkError(Exception):
    """The sink did not accept a batch. Nothing in the batch may be checkpointed."""


class Sink(Protocol):
    async def write(self, records: Sequence[SinkRecord]) -> None:
        """Accept `records` durably, or raise SinkError. Only after it returns may the
        caller advance the checkpoint past these records."""

    async def close(self) -> None:
        """Flush anything buffered and release resources."""
