"""In-memory upstream feeds for the simulation: `seqfeed/1` over sockets that never touch the network.

Each connection's feed produces message n at virtual time n × period (its head grows with the
clock), replays from `after_seq` on subscribe, and refuses a subscribe whose epoch is below the
highest it has seen (`stale_epoch`, docs/design.md §4.1). Like the real feed server, it does not
police a subscription already running: a deposed owner's socket keeps streaming, so only the
worker's own fencing keeps it from delivering (what S1 checks).

A socket implements what the worker's socket loop calls: `recv`, `send`, `close` and
`transport.abort()`. A killed worker's sockets are aborted (no close frame).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from websockets.exceptions import ConnectionClosedError, ConnectionClosedOK
from websockets.frames import Close

from leaseworker.protocol.adapter import ConnectRequest

CONNECT_SECONDS = 0.05  # the handshake, in virtual time
REPLAY_LIMIT = 5_000


@dataclass
class Feed:
    connection_id: str
    period: float
    max_epoch: int = 0
    subscribes: list[tuple[float, int, str, int]] = field(default_factory=list)  # (t, epoch, worker, after)

    def head(self, now: float) -> int:
        # The tolerance: a timer set for message n's instant may fire a rounding error early,
        # and the pump would otherwise sleep for less than the clock can represent, forever.
        return int(now / self.period + 1e-9)


class _Transport:
    def __init__(self, socket: FakeSocket) -> None:
        self._socket = socket

    def abort(self) -> None:
        self._socket.drop()


class FakeSocket:
    def __init__(self, feed: Feed, worker_id: str, forget: Callable[[FakeSocket], None]) -> None:
        self.feed = feed
        self.worker_id = worker_id
        self.transport = _Transport(self)
        self._inbox: asyncio.Queue[str] = asyncio.Queue()
        self._closed: ConnectionClosedOK | ConnectionClosedError | None = None
        self._wake = asyncio.Event()
        self._pump: asyncio.Task[None] | None = None
        self._forget = forget

    async def send(self, text: str) -> None:
        self._raise_if_closed()
        message = json.loads(text)
        if message.get("type") != "subscribe":
            return
        loop = asyncio.get_running_loop()
        epoch, after = int(message["epoch"]), int(message["after_seq"])
        self.feed.subscribes.append((loop.time(), epoch, self.worker_id, after))
        if epoch < self.feed.max_epoch:
            frame = {"type": "error", "code": "stale_epoch", "message": "a higher epoch exists"}
            self._inbox.put_nowait(json.dumps(frame))
            self._close(Close(1008, "stale_epoch"), ok=False)
            return
        self.feed.max_epoch = epoch
        self._pump = loop.create_task(self._stream(after))

    async def _stream(self, after: int) -> None:
        loop = asyncio.get_running_loop()
        seq = max(after, self.feed.head(loop.time()) - REPLAY_LIMIT)
        while self._closed is None:
            head = self.feed.head(loop.time())
            while seq < head and self._closed is None:
                seq += 1
                self._inbox.put_nowait(json.dumps({"type": "data", "seq": seq, "data": {"n": seq}}))
            self._wake.set()
            await asyncio.sleep((head + 1) * self.feed.period - loop.time())

    async def recv(self) -> str:
        while True:
            if not self._inbox.empty() and (self._closed is None or self._closed.rcvd is not None):
                return self._inbox.get_nowait()
            self._raise_if_closed()
            self._wake.clear()
            await self._wake.wait()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self._closed is None:
            self._close(Close(code, reason), ok=True)

    def drop(self) -> None:
        """Aborted: no close frame either way, and nothing more is received."""
        if self._closed is None:
            self._inbox = asyncio.Queue()
            self._close(None, ok=False)

    def _close(self, frame: Close | None, *, ok: bool) -> None:
        kind = ConnectionClosedOK if ok else ConnectionClosedError
        self._closed = kind(frame, frame, True) if frame is not None else kind(None, None, None)
        if self._pump is not None:
            self._pump.cancel()
        self._wake.set()
        self._forget(self)

    def _raise_if_closed(self) -> None:
        if self._closed is not None:
            raise self._closed


class Upstream:
    """Every connection's feed, and the open sockets of each worker."""

    def __init__(self, connection_ids: list[str], period: float) -> None:
        self.feeds = {cid: Feed(cid, period) for cid in connection_ids}
        self.sockets: dict[str, set[FakeSocket]] = {}

    def opener(self, worker_id: str) -> Callable[[ConnectRequest, asyncio.Event], Any]:
        async def open_socket(request: ConnectRequest, stop: asyncio.Event) -> FakeSocket | None:
            await asyncio.sleep(CONNECT_SECONDS)
            if stop.is_set():
                return None
            feed = self.feeds[request.url.rsplit("/", 1)[-1]]
            sockets = self.sockets.setdefault(worker_id, set())
            socket = FakeSocket(feed, worker_id, sockets.discard)
            sockets.add(socket)
            return socket

        return open_socket

    def cut(self, worker_id: str) -> None:
        """A killed worker: its sockets drop."""
        for socket in list(self.sockets.get(worker_id, ())):
            socket.drop()
