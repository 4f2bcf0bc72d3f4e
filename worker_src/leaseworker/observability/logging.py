"""Structured JSON logs (Powertools Logger) with task-scoped keys for a long-running asyncio worker.

Why not Powertools' own key APIs:
- `append_keys` mutates the formatter that every logger shares, so a key added by one session task
  shows up on every other task's lines.
- The "thread-safe" keys are per thread. All session tasks share one thread (the event loop), so
  they leak between tasks too.

Instead, `log_context(**keys)` stores the keys in a `contextvars.ContextVar`. asyncio gives each
task a copy of the context it was created in, so keys set inside a task are seen by that task and
by the tasks it creates, and never by its siblings or its parent. A `logging.Filter` on the one
handler copies the current keys onto each record, where the Powertools formatter picks them up as
extra keys. The mapping in the variable is never mutated, only replaced, so copies cannot alias.

Usage:

    log = get_logger(__name__)
    with log_context(connection_id=cid, epoch=epoch):
        log.info("subscribed", after_seq=last_seq)
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType
from typing import TextIO

from aws_lambda_powertools import Logger

__all__ = [
    "SERVICE_NAME",
    "TaskContextFilter",
    "configure_logging",
    "current_log_context",
    "get_logger",
    "log_context",
    "logger",
    "set_log_context",
]

SERVICE_NAME = os.environ.get("POWERTOOLS_SERVICE_NAME") or "leaseworker"
_PACKAGE_PREFIX = "leaseworker."

_EMPTY: Mapping[str, object] = MappingProxyType({})
_LOG_CONTEXT: ContextVar[Mapping[str, object]] = ContextVar("leaseworker_log_context", default=_EMPTY)


@contextmanager
def log_context(**keys: object) -> Iterator[None]:
    """Add `keys` to every line logged by the current task (and tasks it creates) inside the block.

    Nested blocks merge, the inner value winning. Enter and exit in the same task.
    """
    token = _LOG_CONTEXT.set(MappingProxyType({**_LOG_CONTEXT.get(), **keys}))
    try:
        yield
    finally:
        _LOG_CONTEXT.reset(token)


def set_log_context(**keys: object) -> None:
    """Add `keys` for the rest of the current task's life (no block needed at a task's top level).

    Safe because asyncio runs each task in its own copy of the context: the parent never sees it.
    """
    _LOG_CONTEXT.set(MappingProxyType({**_LOG_CONTEXT.get(), **keys}))


def current_log_context() -> Mapping[str, object]:
    """The keys the current task would add to a log line (read-only)."""
    return _LOG_CONTEXT.get()


class TaskContextFilter(logging.Filter):
    """Copies the task-scoped keys onto each record; keys passed explicitly to the call win."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _LOG_CONTEXT.get().items():
            if key not in record.__dict__:
                setattr(record, key, value)
        return True


class _StdoutHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler whose default target is whatever `sys.stdout` is at emit time.

    Resolving late keeps the handler valid when stdout is swapped (pytest capture, daemonisers).
    """

    def __init__(self) -> None:
        super().__init__(sys.stdout)
        self.target: TextIO | None = None

    def emit(self, record: logging.LogRecord) -> None:
        # emit() runs under the handler lock (Handler.handle), so swapping the stream is safe.
        self.stream = self.target if self.target is not None else sys.stdout
        super().emit(record)


_handler = _StdoutHandler()
_handler.addFilter(TaskContextFilter())

#: The service's root logger. Its std-logging name is SERVICE_NAME; named loggers are its children.
logger: Logger = Logger(service=SERVICE_NAME, logger_handler=_handler, name="%(name)s")


class _ChildLogger(Logger):
    """A Powertools child logger with an explicit name (Powertools derives it from the caller)."""

    def __init__(self, std_name: str) -> None:
        self._std_name = std_name
        super().__init__(service=SERVICE_NAME, child=True)
        # Inherit the level chosen by configure_logging instead of pinning the env default.
        self._logger.setLevel(logging.NOTSET)

    def _get_logger(self) -> logging.Logger:
        return logging.getLogger(self._std_name)


_children: dict[str, Logger] = {}


def get_logger(name: str | None = None) -> Logger:
    """A Powertools Logger writing through the service handler; `name` is usually `__name__`.

    Extra keyword arguments to `log.info(...)` become JSON keys of that line only.
    """
    if not name:
        return logger
    suffix = name.removeprefix(_PACKAGE_PREFIX) if name != SERVICE_NAME else ""
    if not suffix:
        return logger
    std_name = f"{SERVICE_NAME}.{suffix}"
    child = _children.get(std_name)
    if child is None:
        child = _children[std_name] = _ChildLogger(std_name)
    return child


def configure_logging(level: str = "INFO", stream: TextIO | None = None) -> Logger:
    """Set the level and the output stream (default: the current `sys.stdout`) of every worker logger.

    Idempotent; callable again (tests pass a StringIO).
    """
    _handler.target = stream
    logger.setLevel(level.upper())
    return logger
