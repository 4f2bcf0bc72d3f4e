"""`stdout`: one JSON line per record on sys.stdout, flushed before write() returns."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from typing import TextIO

from leaseworker.records import SinkRecord
from leaseworker.sinks.base import SinkError, Validity, always_valid


class StdoutSink:
    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream  # None: whatever sys.stdout is at write time (pytest swaps it)

    async def write(self, records: Sequence[SinkRecord], *, valid: Validity = always_valid) -> None:
        if not records:
            return
        stream = self._stream if self._stream is not None else sys.stdout
        try:
            stream.write("".join(record.to_json() + "\n" for record in records))
            stream.flush()
        except (OSError, ValueError) as exc:  # BrokenPipeError; ValueError: I/O on a closed file
            raise SinkError(f"stdout: {exc}") from exc

    async def close(self) -> None:
        stream = self._stream if self._stream is not None else sys.stdout
        # Nothing buffered can be saved if this fails; write() has already reported the failure.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
