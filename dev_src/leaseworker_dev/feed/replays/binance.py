"""A local Binance Spot market data stream server, from its public documentation:
https://github.com/binance/binance-spot-api-docs/blob/master/web-socket-streams.md and
https://developers.binance.com/docs/binance-spot-api-docs/web-socket-streams.

- Combined streams at `/stream?streams=<a>/<b>/<c>`, each event wrapped as
  `{"stream": "<name>", "data": <payload>}`; raw single streams at `/ws/<name>`. Stream names
  are lowercase; at most 1024 per connection.
- `<symbol>@trade`: `{"e": "trade", "E", "s", "t", "p", "q", "T", "m", "M"}`, trade id `t`
  consecutive per symbol.
- `<symbol>@depth` (1000 ms) and `<symbol>@depth@100ms`: `{"e": "depthUpdate", "E", "s",
  "U", "u", "b", "a"}`: the update ids from U to u; the next event's U is the previous u + 1.
- "The server will send a ping frame every 20 seconds"; no pong within a minute closes the
  connection (`ping_interval`, `ping_timeout` of the server; websockets answers pings).
- "A single connection … is only valid for 24 hours; expect to be disconnected at the 24 hour
  mark" (`max_age_s`, default 24 h).
- "There is a limit of 300 connections per attempt every 5 minutes per IP": a handshake over
  the limit (a sliding window) is refused with HTTP 429 (`connect_limit`).
- It cannot replay.
"""

from __future__ import annotations

import re
import time
from collections import deque
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

from websockets.http11 import Request, Response

from leaseworker_dev.feed.replays.base import (
    Conn,
    Feed,
    ReplayServer,
    Tape,
    http_error,
    register,
    run_until_first,
    sleep_until,
    wall_ms,
)

MAX_STREAMS = 1024
DAY_S = 24 * 3600.0
_STREAM = re.compile(r"([a-z0-9]+)@(trade|depth|depth@100ms)")
UPDATE_IDS_PER_EVENT = 3  # depth event n covers ids BASE + 3n .. BASE + 3n + 2
UPDATE_ID_BASE = 160_000_000
TRADE_ID_BASE = 3_000_000


def streams_of(path: str) -> list[str] | None:
    split = urlsplit(path)
    if split.path.rstrip("/") == "/stream":
        names = parse_qs(split.query).get("streams", [""])[-1]
        return [name for name in names.split("/") if name] or None
    if split.path.startswith("/ws/"):
        return [split.path[4:]]
    return None


@register
class Binance(Feed):
    name: ClassVar[str] = "binance-spot"
    ws_path: ClassVar[str] = "/stream"

    def __init__(self, server: ReplayServer, *, connect_limit: tuple[int, float] = (300, 300.0)) -> None:
        super().__init__(server)
        if server.max_age_s is None:
            server.max_age_s = DAY_S
        self.connect_limit = connect_limit
        self.connects: deque[float] = deque()
        self.trades: Tape = server.tape()

    def refuse(self, request: Request) -> Response | None:
        names = streams_of(request.path)
        if names is None:
            return http_error(404, "unknown path; use /stream?streams=a/b or /ws/<stream>")
        if len(names) > MAX_STREAMS:
            return http_error(400, f"at most {MAX_STREAMS} streams per connection")
        for name in names:
            if not _STREAM.fullmatch(name):
                return http_error(
                    400, f"unsupported stream {name!r} (this replay has @trade, @depth, @depth@100ms)"
                )
        count, window = self.connect_limit
        now = time.monotonic()
        while self.connects and self.connects[0] <= now - window:
            self.connects.popleft()
        if len(self.connects) >= count:
            return http_error(429, f"too many connections: {count} per {window:g} s")
        self.connects.append(now)
        return None

    async def session(self, conn: Conn) -> None:
        names = streams_of(conn.path) or []
        combined = urlsplit(conn.path).path.rstrip("/") == "/stream"
        await run_until_first(self.pump(conn, names, combined), self.drain(conn))

    async def pump(self, conn: Conn, names: list[str], combined: bool) -> None:
        start = time.monotonic()
        trade_next = self.trades.head(start) + 1
        depth: dict[str, tuple[Tape, int]] = {}
        for name in names:
            match = _STREAM.fullmatch(name)
            assert match is not None
            if match.group(2).startswith("depth"):
                tape = Tape(10.0 if match.group(2).endswith("100ms") else 1.0, self.server.t0)
                depth[name] = (tape, tape.head(start) + 1)
        while True:
            now = time.monotonic()
            head = self.trades.head(now)
            while trade_next <= head:
                for name in names:
                    if name.endswith("@trade"):
                        await self.emit(conn, name, combined, self.trade(name, trade_next), "t")
                trade_next += 1
            wake = self.trades.time_of(trade_next)
            for name, (tape, first) in depth.items():
                n = first
                while n <= tape.head(now):
                    await self.emit(conn, name, combined, self.depth(name, n), "u")
                    n += 1
                depth[name] = (tape, n)
                wake = min(wake, tape.time_of(n))
            await sleep_until(wake)

    @staticmethod
    async def emit(conn: Conn, name: str, combined: bool, payload: dict[str, Any], cursor: str) -> None:
        message = {"stream": name, "data": payload} if combined else payload
        await conn.send_data(message, [(name, payload[cursor], message)])

    @staticmethod
    def trade(name: str, n: int) -> dict[str, Any]:
        now = wall_ms()
        return {
            "e": "trade",
            "E": now,
            "s": name.split("@", maxsplit=1)[0].upper(),
            "t": TRADE_ID_BASE + n,
            "p": f"{60000 + n % 700}.{n % 100:02d}000000",
            "q": f"0.{(n % 89) + 1:05d}000",
            "T": now,
            "m": n % 2 == 0,
            "M": True,
        }

    @staticmethod
    def depth(name: str, n: int) -> dict[str, Any]:
        first = UPDATE_ID_BASE + n * UPDATE_IDS_PER_EVENT
        return {
            "e": "depthUpdate",
            "E": wall_ms(),
            "s": name.split("@", maxsplit=1)[0].upper(),
            "U": first,
            "u": first + UPDATE_IDS_PER_EVENT - 1,
            "b": [[f"{60000 - n % 50}.00000000", f"{n % 7}.00000000"]],
            "a": [[f"{60001 + n % 50}.00000000", f"{n % 5}.00000000"]],
        }

    @staticmethod
    async def drain(conn: Conn) -> None:
        async for _ in conn.ws:  # SUBSCRIBE/UNSUBSCRIBE requests are not modelled
            pass
