"""HTTP connections for AWS clients that cannot deliver a request after it was abandoned (§2d, §2e).

A request the worker gave up on (a sink write past its deadline, a DynamoDB call past its own)
must not land later, after the lease has moved. Two places can still hold its bytes:

1. **The kernel's send queue.** `close()` on a TCP socket normally lingers: the kernel keeps
   retransmitting what was queued until the peer acknowledges it, then sends FIN, even after the
   process has exited. With SO_LINGER {on, 0}, `close()` discards the queue and sends RST instead.
   Any close does, including the implicit one when the process dies (SIGKILL, the OOM killer),
   which is what lets the supervisor's fence (§2e) be final. A request cut short this way reaches
   the server incomplete, and an HTTP server never acts on an incomplete request.
2. **asyncio's write buffer.** What the kernel would not take yet sits in the transport. aiohttp
   closes a connection it abandons (cancellation, a read timeout) with `transport.close()`, which
   keeps the socket open until that buffer has drained: a stalled request is sent in full
   whenever the path recovers, however much later. `transport.abort()` drops the buffer and
   closes the socket at once. So every close of these connections is an abort
   (`AbortOnCloseHandler`).

Both are needed (tests/worker/integration/test_late_write.py shows each): with only (2), a request that fits
in the kernel's buffers is still sent in full after close(), and lands; with only (1), the
abandoned request is still alive when the sink gives up, its socket open, and asyncio sends its
buffer whenever the path lets it, so whether it completes depends on the path, not on us.
RST instead of FIN costs nothing here: an HTTP/1.1 client closes only idle connections or
abandoned ones, and the server has nothing to finish on either. TLS close_notify is skipped for
the same reason.

How it is wired. aiobotocore 2.25's `AioConfig(connector_args=...)` rejects aiohttp's
`socket_factory` (aio-libs/aiobotocore#1450; accepted from #1454, a later release), so
`NoLingerAIOHTTPSession` is passed as `AioConfig(http_session_cls=...)`: it adds the socket
factory to the connector arguments, and gives the connector a protocol factory whose close() is
an abort. The first step is aiohttp's public `socket_factory` (3.12+). The second has no public
form: aiohttp offers no way to choose the protocol a connector builds (checked against its
documentation for 3.14), so it sets `TCPConnector._factory`, a private attribute, and reads
`ResponseHandler._connection_lost_called`; aiobotocore's `_create_connector` is private too.
Therefore aiohttp and aiobotocore are pinned exactly in requirements.txt, `_create_connector`
fails loudly if the attribute is gone, tests/worker/unit/test_no_linger_private_api.py fails when an
upgrade changes any of that surface (run it before bumping either pin), and
tests/worker/integration/test_late_write.py checks both effects on live sockets.

3. **A write that starts after its deadline.** A delivery checks its lease right before it
   calls the sink, but the process can stop between that check and the moment its bytes are
   written (SIGSTOP, a VM freeze): on waking, asyncio runs the pending write before the timer
   that would cancel it (I/O callbacks precede due timers in one loop iteration), and a request
   built under a valid lease lands after the takeover (seen: tests/system/test_failover.py, one
   PutRecords of epoch 1 in the shard after its successor's records). So a delivery sets
   `send_deadline(valid_until)`, and every write to these connections checks it at the moment of
   writing: past it, the connection is aborted and nothing is sent. The ContextVar follows the
   request into aiohttp's body-writing task, which copies the context when it is created.

What this cannot prevent: a request that reached the server in full before it was abandoned
(e.g. Kinesis slow to answer) may still be applied. The consumer filter (`leaseworker.consumer`)
drops such a record by its lower epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import struct
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, ClassVar, Final

import aiohttp
from aiobotocore.httpsession import AIOHTTPSession
from aiohttp.client_proto import ResponseHandler

from leaseworker.clock import monotonic

if TYPE_CHECKING:
    from aiohappyeyeballs import AddrInfoType

LINGER_ZERO: Final = struct.pack("ii", 1, 0)  # struct linger {l_onoff = 1, l_linger = 0}

# The monotonic instant after which no byte of the current request may be written (None: no limit).
SEND_DEADLINE: ContextVar[float | None] = ContextVar("leaseworker_send_deadline", default=None)


class SendDeadlinePassed(ConnectionResetError):
    """A write was attempted after its request's deadline; the connection was aborted unsent."""


@contextlib.contextmanager
def send_deadline(at: float) -> Iterator[None]:
    """Requests made inside this block send nothing once monotonic() reaches `at`."""
    token = SEND_DEADLINE.set(at)
    try:
        yield
    finally:
        SEND_DEADLINE.reset(token)


def _check_deadline(transport: asyncio.WriteTransport) -> None:
    deadline = SEND_DEADLINE.get()
    if deadline is not None and monotonic() >= deadline:
        transport.abort()
        raise SendDeadlinePassed("send deadline passed: the request was dropped, never sent late")


class UnguardedTransport(RuntimeError):
    """A transport whose writes cannot be made to check SEND_DEADLINE: it was aborted unused."""


def _guard_writes(transport: asyncio.BaseTransport) -> None:
    """Make this transport's write and writelines check SEND_DEADLINE first.

    A transport that cannot take the guard is refused, never used unguarded: a write on it could
    start past its lease (point 3). Seen with uvloop, whose compiled TCPTransport is no
    asyncio.WriteTransport and has a read-only `write`; the guard used to skip it in silence, and
    a paused child's PutRecords landed after the takeover (tests/system/test_fast_takeover.py).
    """
    if not isinstance(transport, asyncio.WriteTransport):
        _refuse(transport, "it is not an asyncio.WriteTransport")
        return
    write, writelines = transport.write, transport.writelines

    def checked_write(data: bytes | bytearray | memoryview) -> None:
        _check_deadline(transport)
        write(data)

    def checked_writelines(lines: Iterable[bytes | bytearray | memoryview[Any]]) -> None:
        _check_deadline(transport)
        writelines(lines)

    # Instance attributes shadow the class's methods for this one connection, on purpose: aiohttp
    # calls transport.write/writelines, and there is no hook between them and the socket.
    try:
        transport.write = checked_write  # type: ignore[method-assign]
        transport.writelines = checked_writelines  # type: ignore[method-assign,assignment]
    except AttributeError:
        _refuse(transport, "its write methods are read-only")


def _refuse(transport: asyncio.BaseTransport, why: str) -> None:
    """Abort the connection before anything is written, and say so loudly."""
    abort = getattr(transport, "abort", None)
    (abort if callable(abort) else transport.close)()
    raise UnguardedTransport(
        f"{type(transport).__qualname__}: {why}, so the send deadline cannot be enforced on it;"
        " the connection was aborted before any write (docs/design.md §2d)"
    )


# Futures of aborted connections whose socket is not closed yet (asyncio closes it one loop
# iteration after abort()). abandoned_sockets_closed() waits for them.
_closing: set[asyncio.Future[None]] = set()


def no_linger_socket(addr_info: AddrInfoType) -> socket.socket:
    """aiohttp `socket_factory`: a socket whose close() sends RST and discards unsent bytes."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_ZERO)
    except OSError:
        sock.close()
        raise
    return sock


class AbortOnCloseHandler(ResponseHandler):
    """aiohttp's response protocol, except that closing the connection aborts it, and that
    nothing is written past the request's send deadline (point 3 above)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        try:
            _guard_writes(transport)
        finally:
            super().connection_made(transport)  # a refused one is then lost the usual way

    def close(self) -> None:
        if self.transport is not None and not self._connection_lost_called:
            closed = self.closed  # resolved in connection_lost, right before the socket closes
            if closed is not None:
                _closing.add(closed)
                closed.add_done_callback(_forget)
        self.abort()


def _abort_on_close_handler(loop: asyncio.AbstractEventLoop) -> ResponseHandler:
    return AbortOnCloseHandler(loop)


def _forget(future: asyncio.Future[None]) -> None:
    _closing.discard(future)
    if not future.cancelled():
        future.exception()  # retrieved: a reset is the expected end, not an error to log


async def abandoned_sockets_closed() -> None:
    """Return once every connection aborted so far on this loop has closed its socket.

    After this, no byte of an abandoned request can leave this process any more: a release or
    a handoff that follows it cannot be overtaken by the abandoned request.
    """
    loop = asyncio.get_running_loop()
    # A future is resolved in connection_lost, inside the callback that then closes the socket;
    # a waiter resumes in a later callback, so once wait() returns every such socket is closed.
    pending = [future for future in _closing if future.get_loop() is loop and not future.done()]
    if pending:
        await asyncio.wait(pending)


class NoLingerAIOHTTPSession(AIOHTTPSession):
    """aiobotocore's HTTP session with SO_LINGER {on, 0} sockets and aborting closes.

    Use it as `AioConfig(http_session_cls=NoLingerAIOHTTPSession)`. The class attributes exist
    so that a test can show what each half prevents; production code never changes them.
    """

    linger_zero: ClassVar[bool] = True
    abort_on_close: ClassVar[bool] = True

    def __init__(self, **kwargs: Any) -> None:
        # aiobotocore passes every argument by keyword; connector_args comes from AioConfig.
        connector_args = dict(kwargs.pop("connector_args", None) or {})
        if self.linger_zero:
            connector_args["socket_factory"] = no_linger_socket
        super().__init__(connector_args=connector_args, **kwargs)

    def _create_connector(self, proxy_url: str | None) -> aiohttp.TCPConnector:
        build = getattr(super(), "_create_connector")  # noqa: B009 - absent from the type stubs
        connector: aiohttp.TCPConnector = build(proxy_url)
        if self.abort_on_close:
            if not isinstance(getattr(connector, "_factory", None), functools.partial):
                raise RuntimeError("aiohttp.TCPConnector._factory is gone: cannot make closes abort")
            connector._factory = functools.partial(_abort_on_close_handler, loop=asyncio.get_running_loop())
        return connector
