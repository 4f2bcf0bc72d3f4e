"""A small asyncio TCP proxy for fault tests and benchmarks (DESIGN.md §10).

Put it in front of DynamoDB Local and one worker sees latency, a blackhole (bytes vanish,
sockets stay open: calls time out) or resets, while its peers talk to DynamoDB directly. It
also counts DynamoDB operations by their `X-Amz-Target` header, which is how the benchmark
measures what each lease design costs.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
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
    def __init__(self, target_host: str, target_port: int, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.host = host
        self.port = port
        self.mode: Mode = "pass"
        self.latency = 0.0
        self.counts: Counter[str] = Counter()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
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
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.transport.abort()
            return
        self._writers.update((client_writer, upstream_writer))
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._pipe(client_reader, upstream_writer, count=True))
                group.create_task(self._pipe(upstream_reader, client_writer, count=False))
        except* (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for writer in (client_writer, upstream_writer):
                self._writers.discard(writer)
                writer.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, count: bool) -> None:
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
        writer.transport.abort()


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
