"""Containment for the worker's long-running loops."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from leaseworker.observability.logging import get_logger

logger = get_logger(__name__)


@contextlib.contextmanager
def survive(loop: str) -> Iterator[None]:
    """A bug in one iteration of a loop is logged, not allowed to take the worker down: the
    leases' local deadlines keep every lost write safe. CancelledError (a BaseException) passes."""
    try:
        yield
    except Exception:
        logger.exception("unexpected error in a worker loop; continuing", extra={"loop": loop})
