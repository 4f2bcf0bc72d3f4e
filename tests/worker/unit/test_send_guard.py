"""A transport whose writes cannot check the send deadline is refused, never used unguarded (§2d).

The guard works by shadowing the transport's write methods on the instance. uvloop's compiled
transport is no asyncio.WriteTransport and its `write` is read-only: the guard used to return in
silence there, and a paused child's PutRecords landed after the takeover. Now such a transport is
aborted before any write and the refusal is raised.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from leaseworker.no_linger import AbortOnCloseHandler, UnguardedTransport, send_deadline


class ReadOnlyWrites(asyncio.WriteTransport):
    """Like a compiled transport: its write methods cannot be replaced on the instance."""

    __slots__ = ("aborted", "written")

    def __init__(self) -> None:
        self.aborted = False
        self.written: list[bytes] = []

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class NotAWriteTransport(asyncio.BaseTransport):
    def __init__(self) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class Replaceable(ReadOnlyWrites):
    """The same transport with an instance dict: the guard can take hold."""

    __slots__ = ("__dict__",)


@pytest.mark.parametrize("transport_type", [ReadOnlyWrites, NotAWriteTransport])
async def test_a_transport_the_guard_cannot_hold_is_aborted_before_any_write(
    transport_type: type[Any],
) -> None:
    transport = transport_type()
    handler = AbortOnCloseHandler(asyncio.get_running_loop())
    with pytest.raises(UnguardedTransport, match="send deadline cannot be enforced"):
        handler.connection_made(transport)
    assert transport.aborted
    assert handler.transport is transport  # lost the usual way once the abort lands


async def test_a_guarded_transport_writes_before_its_deadline_and_never_after() -> None:
    transport = Replaceable()
    AbortOnCloseHandler(asyncio.get_running_loop()).connection_made(transport)
    loop = asyncio.get_running_loop()
    with send_deadline(loop.time() + 60):
        transport.write(b"in time")
    with send_deadline(loop.time() - 1), pytest.raises(ConnectionResetError):
        transport.write(b"late")
    assert transport.written == [b"in time"]
    assert transport.aborted
