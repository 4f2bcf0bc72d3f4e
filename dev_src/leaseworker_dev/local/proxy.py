"""A small asyncio TCP proxy for fault tests and benchmarks (docs/design.md §10).

Put it in front of DynamoDB Local and one worker sees latency, a blackhole (bytes vanish,
sockets stay open: calls time out) or resets, while its peers talk to DynamoDB directly. It
also counts DynamoDB operations by their `X-Amz-Target` header, which is how the benchmark
measures what each lease design costs.

It can also stall one connection (`stall_next_connection`, `release_stalled`), the way a
congested or partitioned path does: the proxy stops reading that client's bytes, so they back up
in the kernel's buffers and the sender's own, and flow again on release. In front of moto's
Kinesis this is how tests/worker/integration/test_late_write.py makes a write that was abandoned try to land
after the lease has moved. A stalled connection's end is passed on faithfully: a FIN from the
client becomes a FIN to the server once every byte received is forwarded (a request the client's
kernel still completes is delivered); a reset becomes a reset (an incomplete request stays
incomplete).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import threading
from collections import Counter
from typing import Literal

Mode = Literal["pass", "blackhole", "reset"]
_TARGET = re.compile(rb"X-Amz-Target: DynamoDB_\d+\.(\w+)", re.IGNORECASE)
# Which write an UpdateItem is: its expression's first assignment tells renew, checkpoint,
# acquire and release apart (e.g. "SET lease_expires_at_ms = :expires" is a renewal).
_UPDATE = re.compile(rb'"UpdateExpression":\s*"(SET \w+ = :\w+)')
_CHUNK = 65536


class TcpProxy:
    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        receive_buffer_bytes: int | None = None,
    ) -> None:
        """`receive_buffer_bytes` sets SO_RCVBUF on the accepted sockets (the kernel doubles it):
        small, it keeps most of a stalled request in the sender's buffers, as a stalled path does."""
        self.target = (target_host, target_port)
        self.host = host
        self.port = port
        self.mode: Mode = "pass"
        self.latency = 0.0
        self.counts: Counter[str] = Counter()
        self.receive_buffer_bytes = receive_buffer_bytes
        self.stalled_accepted = asyncio.Event()  # set once the stalled connection has arrived
        self.stalled_finished = asyncio.Event()  # set once it has ended, after its release
        self._stall_next = False
        self._release = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        listener = socket.create_server((self.host, self.port))
        if self.receive_buffer_bytes is not None:
            # Accepted sockets inherit it from the listener, window scale included.
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.receive_buffer_bytes)
        self._server = await asyncio.start_server(self._serve, sock=listener)
        self.port = self._server.sockets[0].getsockname()[1]

    def stall_next_connection(self) -> None:
        """Read nothing from the next client that connects until release_stalled()."""
        self._stall_next = True
        self._release.clear()
        self.stalled_accepted.clear()
        self.stalled_finished.clear()

    def release_stalled(self) -> None:
        """Let the stalled connection's bytes flow again (those its sender still sends)."""
        self._release.set()

    async def stop(self) -> None:
        self._release.set()  # a stalled connection's task must not wait past the proxy's end
        if self._server is not None:
            self._server.close()
            self._abort_all()
            await self._server.wait_closed()

    def set_mode(self, mode: Mode) -> None:
        self.mode = mode
        if mode == "reset":
            self._abort_all()

    def _abort_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self.mode == "reset":
            client_writer.transport.abort()
            return
        stalled, self._stall_next = self._stall_next, False
        if stalled:
            _read_side(client_writer).pause_reading()  # bytes wait in the kernel, not in the proxy
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.transport.abort()
            return
        self._writers.update((client_writer, upstream_writer))
        if stalled:
            self.stalled_accepted.set()
            await self._release.wait()
            _read_side(client_writer).resume_reading()
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._pipe(client_reader, upstream_writer, count=True, half_close=stalled))
                group.create_task(self._pipe(upstream_reader, client_writer, count=False))
        except* (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for writer in (client_writer, upstream_writer):
                self._writers.discard(writer)
                writer.transport.abort()
            if stalled:
                self.stalled_finished.set()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        count: bool,
        half_close: bool = False,
    ) -> None:
        while data := await reader.read(_CHUNK):
            if count:
                self.counts.update(match.decode() for match in _TARGET.findall(data))
                self.counts.update(f"UpdateItem[{match.decode()}]" for match in _UPDATE.findall(data))
            if self.latency:
                await asyncio.sleep(self.latency)
            if self.mode == "blackhole":
                continue  # swallowed: the peer waits until its own deadline
            if self.mode == "reset":
                break
            writer.write(data)
            await writer.drain()
        if half_close:
            writer.write_eof()  # after what is buffered: the server reads the request it was sent
            return
        writer.transport.abort()


def _read_side(writer: asyncio.StreamWriter) -> asyncio.ReadTransport:
    transport = writer.transport
    assert isinstance(transport, asyncio.ReadTransport)  # a socket's transport reads and writes
    return transport


class ProxyThread:
    """Runs a TcpProxy on its own event loop, for synchronous test and benchmark code."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self._loop = asyncio.new_event_loop()
        self.proxy = TcpProxy(target_host, target_port)
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> ProxyThread:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _shutdown(self) -> None:
        await self.proxy.stop()
        # stop() aborted every socket, so the connection tasks end on their own; cancelling them
        # instead makes asyncio's stream callback log a CancelledError for each.
        pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        if pending:
            await asyncio.wait(pending, timeout=2.0)

    @property
    def url(self) -> str:
        return self.proxy.url

    def set_mode(self, mode: Mode) -> None:
        self._loop.call_soon_threadsafe(self.proxy.set_mode, mode)

    def counts(self) -> Counter[str]:
        return asyncio.run_coroutine_threadsafe(self._snapshot(), self._loop).result(5)

    async def _snapshot(self) -> Counter[str]:
        return Counter(self.proxy.counts)
