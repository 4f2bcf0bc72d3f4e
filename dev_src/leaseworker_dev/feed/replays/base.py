"""What every local feed replay shares: the server, the ledger, the clock of the stream, knobs.

A replay is an asyncio `websockets` server on 127.0.0.1 that speaks one real feed's protocol as
its public documentation describes it (each feed's module cites its pages), over a synthetic,
deterministic, endless stream: item n of key k exists from `t0 + n / rate` on, and its content
is a pure function of (k, n). What a feed cannot replay is simply never sent to a client that
was not connected when it happened, exactly like the real feed.

The ledger is the upstream's side of the story, for tests: every connection's open and close
(wall ms, close code), and every data message handed to the socket (wall ms, connection, key,
cursor, the message). A test checks from it that every message sent reached the sink, and that
whatever was not sent to anyone (between two connections, or skipped on purpose with `skip`)
lies inside a gap marker.

Knobs: `drop()` ends every open connection now (`abort`: the TCP connection just goes, no close
frame; `close`: a close frame with a code); `skip(n)` silently loses the next n data messages
(they are in the ledger as `skipped`, never sent), an upstream's own loss inside one socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, ClassVar, Final, Literal, Self

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from leaseworker_dev.feed.replays.limits import ConnectLimit

HOST: Final = "127.0.0.1"  # a replay binds to loopback only
CLOSE_TIMEOUT: Final = 1.0
MAX_TICK: Final = 0.05  # the longest a pump sleeps between two looks at the stream's head

LedgerKind = Literal["open", "close", "data", "skipped", "refused"]


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def dumps(message: Any) -> str:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False)


def iso(ms: int) -> str:
    """RFC 3339 with microseconds, as the exchanges write their times."""
    seconds, rest = divmod(ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{rest:03d}000Z"


@dataclass(frozen=True, slots=True)
class Entry:
    kind: LedgerKind
    t_ms: int
    conn: int
    key: str | None = None
    cursor: Any = None
    message: Any = None
    code: int | None = None  # a close's code, a refusal's HTTP status or error code


@dataclass
class Ledger:
    """Append-only, in send order. `wait_for` lets a test await a condition on it."""

    entries: list[Entry] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, entry: Entry) -> None:
        self.entries.append(entry)
        self._changed.set()

    def data(self, *, conn: int | None = None, key: str | None = None) -> list[Entry]:
        return [
            e
            for e in self.entries
            if e.kind == "data" and (conn is None or e.conn == conn) and (key is None or e.key == key)
        ]

    def of_kind(self, kind: LedgerKind) -> list[Entry]:
        return [e for e in self.entries if e.kind == kind]

    def connections(self) -> list[int]:
        return [e.conn for e in self.entries if e.kind == "open"]

    async def wait_for(self, predicate: Callable[[Ledger], bool], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate(self):
                self._changed.clear()
                await self._changed.wait()


@dataclass
class Tape:
    """One key's endless stream: item n exists from t0 + n / rate (n = 0, 1, …)."""

    rate: float
    t0: float

    def head(self, now: float) -> int:
        """The highest n that exists at `now` (-1: none yet)."""
        if self.rate <= 0:
            return -1
        return math.floor((now - self.t0) * self.rate)

    def time_of(self, n: int) -> float:
        return self.t0 + n / self.rate if self.rate > 0 else math.inf


class Conn:
    """One client connection as a feed sees it: sends that the ledger records."""

    def __init__(self, server: ReplayServer, ws: ServerConnection, number: int) -> None:
        self.server = server
        self.ws = ws
        self.id = number
        self.last_send = time.monotonic()

    @property
    def path(self) -> str:
        return self.ws.request.path if self.ws.request is not None else "/"

    async def send(self, message: Any) -> None:
        """A control message (ack, heartbeat, error): not in the ledger."""
        await self.ws.send(message if isinstance(message, str) else dumps(message))
        self.last_send = time.monotonic()

    async def send_data(self, message: Any, items: Iterable[tuple[str | None, Any, Any]]) -> None:
        """One frame holding data items `(key, cursor, item)`, each recorded when it was sent;
        a skipped frame (`skip`) is recorded as `skipped` and never sent."""
        items = list(items)
        if self.server.take_skip():
            for key, cursor, item in items:
                self.server.ledger.add(Entry("skipped", wall_ms(), self.id, key, cursor, item))
            return
        await self.send(message)
        now = wall_ms()
        for key, cursor, item in items:
            self.server.ledger.add(Entry("data", now, self.id, key, cursor, item))

    async def recv_json(self, timeout: float | None = None) -> Any:
        """The next client message, parsed (a non-JSON text is returned as the string)."""
        async with asyncio.timeout(timeout):
            raw = await self.ws.recv()
        try:
            return json.loads(raw)
        except ValueError:
            return raw

    async def close(self, code: int = 1000, reason: str = "") -> None:
        with contextlib.suppress(Exception):
            await self.ws.close(code, reason)


class Feed:
    """One feed's protocol. Subclasses set `name` and implement `session`."""

    name: ClassVar[str]
    ws_path: ClassVar[str] = "/"  # what `server.url` points at

    def __init__(self, server: ReplayServer, **options: Any) -> None:
        self.server = server
        if options:
            raise TypeError(f"{self.name} replay: unknown options {', '.join(sorted(options))}")

    def refuse(self, request: Request) -> Response | None:
        """An HTTP refusal of the opening handshake (a rate limit, a bad path), or None."""
        return None

    async def session(self, conn: Conn) -> None:
        raise NotImplementedError


FEEDS: dict[str, type[Feed]] = {}


def register(cls: type[Feed]) -> type[Feed]:
    FEEDS[cls.name] = cls
    return cls


class ReplayServer:
    """`async with ReplayServer(feed="coinbase-exchange", port=0) as server:` → server.url,
    server.ledger, server.drop(), server.skip(n). Feed options go to the feed's class."""

    def __init__(
        self,
        *,
        feed: str,
        port: int = 0,
        rate: float = 20.0,
        ping_interval: float | None = 20.0,
        ping_timeout: float | None = 20.0,
        max_age_s: float | None = None,
        host_limit: ConnectLimit | None = None,
        **options: Any,
    ) -> None:
        from leaseworker_dev.feed.replays import load_feeds

        load_feeds()
        if feed not in FEEDS:
            raise ValueError(f"unknown feed {feed!r}; one of: {', '.join(sorted(FEEDS))}")
        if not rate > 0 or math.isinf(rate):
            raise ValueError(f"rate must be a finite number > 0, got {rate!r}")
        self.rate = rate
        self.t0 = time.monotonic()
        self.t0_wall_ms = wall_ms()
        self.ledger = Ledger()
        self.max_age_s = max_age_s
        self.host_limit = host_limit  # connects per window (limits.py): 429, then a 418 ban, beyond it
        self._port = port
        self._ping = (ping_interval, ping_timeout)
        self._numbers = itertools.count(1)
        self._open: dict[int, Conn] = {}
        self._skip = 0
        self._server: Server | None = None
        self.feed = FEEDS[feed](self, **options)

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._server = await serve(
            self._handle,
            HOST,
            self._port,
            compression=None,
            close_timeout=CLOSE_TIMEOUT,
            ping_interval=self._ping[0],
            ping_timeout=self._ping[1],
            process_request=self._process_request,
        )
        self._port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    @property
    def url(self) -> str:
        return f"ws://{HOST}:{self._port}{self.feed.ws_path}"

    @property
    def base_url(self) -> str:
        return f"ws://{HOST}:{self._port}"

    # -- knobs -------------------------------------------------------------------------------

    @property
    def open_connections(self) -> list[int]:
        return sorted(self._open)

    async def drop(self, mode: Literal["abort", "close"] = "abort", code: int = 1011) -> int:
        """End every open connection now; returns how many."""
        conns = list(self._open.values())
        for conn in conns:
            if mode == "abort":
                conn.ws.transport.abort()
            else:
                await conn.close(code, "replay: dropped")
        return len(conns)

    def skip(self, count: int = 1) -> None:
        """Lose the next `count` data frames (whichever connection sends them)."""
        self._skip += count

    def take_skip(self) -> bool:
        if self._skip > 0:
            self._skip -= 1
            return True
        return False

    def tape(self, rate: float | None = None) -> Tape:
        return Tape(self.rate if rate is None else rate, self.t0)

    # -- connections -------------------------------------------------------------------------

    def _process_request(self, ws: ServerConnection, request: Request) -> Response | None:
        refusal = self.feed.refuse(request)
        if refusal is None and self.host_limit is not None:
            refusal = self.host_limit.admit()
        if refusal is not None:
            self.ledger.add(Entry("refused", wall_ms(), 0, code=refusal.status_code, message=request.path))
        return refusal

    async def _handle(self, ws: ServerConnection) -> None:
        conn = Conn(self, ws, next(self._numbers))
        self._open[conn.id] = conn
        self.ledger.add(Entry("open", wall_ms(), conn.id, message=conn.path))
        try:
            async with asyncio.timeout(self.max_age_s):
                await self.feed.session(conn)
        except (ConnectionClosed, TimeoutError):
            pass
        finally:
            del self._open[conn.id]
            await conn.close()
            code = ws.close_code if ws.close_code is not None else 1006
            self.ledger.add(Entry("close", wall_ms(), conn.id, code=code, message=ws.close_reason))


def http_error(status: int, body: str) -> Response:
    return Response(
        status, _REASONS.get(status, "Error"), Headers([("Content-Type", "text/plain")]), body.encode()
    )


_REASONS: Final = {400: "Bad Request", 404: "Not Found", 429: "Too Many Requests"}


async def run_until_first(*coroutines: Coroutine[Any, Any, None]) -> None:
    """Run the coroutines until the first ends (normally or by ConnectionClosed); cancel the
    rest. Any other exception propagates."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(
            result, ConnectionClosed | asyncio.CancelledError
        ):
            raise result


async def sleep_until(deadline: float) -> None:
    await asyncio.sleep(min(max(deadline - time.monotonic(), 0.001), MAX_TICK))
