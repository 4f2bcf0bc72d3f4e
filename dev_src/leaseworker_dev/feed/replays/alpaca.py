"""A local Alpaca market data stream (wss://stream.data.alpaca.markets/v2/{feed}), from its
public documentation: https://docs.alpaca.markets/docs/streaming-market-data (connection,
authentication, errors, connection limit) and
https://docs.alpaca.markets/docs/real-time-stock-pricing-data (subscribe, trade schema).

- Every frame, both ways from the server, is a JSON array of messages with a `T` type.
- On connect: `[{"T": "success", "msg": "connected"}]`.
- Auth: `{"action": "auth", "key", "secret"}` → `[{"T": "success", "msg": "authenticated"}]`, or
  `[{"T": "error", "code": 402, "msg": "auth failed"}]` and a close. No auth in time (10 s):
  404 "auth timeout". A second auth: 403 "already authenticated".
- "The number of connections to a single endpoint from a user is limited …; in most
  subscriptions … this limit is 1": a second authenticated connection of the same key gets
  `[{"T": "error", "code": 406, "msg": "connection limit exceeded"}]` and a close.
- Subscribe before auth: 401 "not authenticated"; malformed: 400 "invalid syntax"; over the
  symbol limit: 405 "symbol limit exceeded".
- Subscribe `{"action": "subscribe", "trades": [...], "quotes": [...], "bars": [...]}` →
  `[{"T": "subscription", "trades": [...], "quotes": [...], "bars": [...], …}]`.
- Trades: `{"T": "t", "S", "i", "x", "p", "s", "c", "t", "z"}`, batched in one array; the trade
  id `i` is per exchange, increasing here but not consecutive.
- It cannot replay.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from websockets.http11 import Request, Response

from leaseworker_dev.feed.replays.base import (
    Conn,
    Feed,
    ReplayServer,
    Tape,
    http_error,
    iso,
    register,
    run_until_first,
    sleep_until,
    wall_ms,
)

FEEDS = frozenset({"iex", "sip", "delayed_sip", "boats", "overnight", "test"})
AUTH_TIMEOUT_S = 10.0
REPLAY_KEY = "replay-key"
REPLAY_SECRET = "replay-secret"
EMPTY_LISTS = (
    "quotes",
    "bars",
    "updatedBars",
    "dailyBars",
    "statuses",
    "lulds",
    "corrections",
    "cancelErrors",
)


def error(code: int, msg: str) -> list[dict[str, Any]]:
    return [{"T": "error", "code": code, "msg": msg}]


def trade(symbol: str, n: int) -> dict[str, Any]:
    return {
        "T": "t",
        "S": symbol,
        "i": 50_000 + 3 * n + n % 2,  # increasing, not consecutive (ids are per exchange)
        "x": "V",
        "p": round(126.55 + (n % 40) * 0.01, 2),
        "s": 1 + n % 100,
        "c": ["@", "I"],
        "t": iso(wall_ms()),
        "z": "C",
    }


@register
class Alpaca(Feed):
    name: ClassVar[str] = "alpaca"
    ws_path: ClassVar[str] = "/v2"

    def __init__(
        self,
        server: ReplayServer,
        *,
        key: str = REPLAY_KEY,
        secret: str = REPLAY_SECRET,
        connection_limit: int = 1,
        symbol_limit: int = 30,
    ) -> None:
        super().__init__(server)
        self.credentials = (key, secret)
        self.connection_limit = connection_limit
        self.symbol_limit = symbol_limit
        self.authenticated: set[int] = set()  # connections holding the account's slot
        self.tape: Tape = server.tape()

    def refuse(self, request: Request) -> Response | None:
        parts = request.path.split("?")[0].strip("/").split("/")
        if len(parts) != 2 or parts[0] != "v2" or parts[1] not in FEEDS:
            return http_error(404, "unknown feed; use /v2/{iex|sip|delayed_sip|test|…}")
        return None

    async def session(self, conn: Conn) -> None:
        await conn.send([{"T": "success", "msg": "connected"}])
        try:
            await self.authenticate(conn)
            if conn.id not in self.authenticated:
                return
            trades: list[str] = []
            await run_until_first(self.requests(conn, trades), self.pump(conn, trades))
        finally:
            self.authenticated.discard(conn.id)

    async def authenticate(self, conn: Conn) -> None:
        deadline = time.monotonic() + AUTH_TIMEOUT_S
        while True:
            try:
                request = await conn.recv_json(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                await conn.send(error(404, "auth timeout"))
                await conn.close(1008, "auth timeout")
                return
            if not isinstance(request, dict):
                await conn.send(error(400, "invalid syntax"))
                continue
            if request.get("action") != "auth":
                await conn.send(error(401, "not authenticated"))
                continue
            if (request.get("key"), request.get("secret")) != self.credentials:
                await conn.send(error(402, "auth failed"))
                await conn.close(1008, "auth failed")
                return
            if len(self.authenticated) >= self.connection_limit:
                await conn.send(error(406, "connection limit exceeded"))
                await conn.close(1008, "connection limit exceeded")
                return
            self.authenticated.add(conn.id)
            await conn.send([{"T": "success", "msg": "authenticated"}])
            return

    async def requests(self, conn: Conn, trades: list[str]) -> None:
        while True:
            request = await conn.recv_json()
            if not isinstance(request, dict) or not isinstance(request.get("trades", []), list):
                await conn.send(error(400, "invalid syntax"))
                continue
            action = request.get("action")
            if action == "auth":
                await conn.send(error(403, "already authenticated"))
                continue
            if action not in ("subscribe", "unsubscribe"):
                await conn.send(error(400, "invalid syntax"))
                continue
            symbols = [s for s in request.get("trades", []) if isinstance(s, str)]
            if action == "subscribe":
                wanted = list(dict.fromkeys([*trades, *symbols]))
                if len(wanted) > self.symbol_limit:
                    await conn.send(error(405, "symbol limit exceeded"))
                    continue
                trades[:] = wanted
            else:
                trades[:] = [s for s in trades if s not in symbols]
            await conn.send([{"T": "subscription", "trades": list(trades), **{k: [] for k in EMPTY_LISTS}}])

    async def pump(self, conn: Conn, trades: list[str]) -> None:
        next_n = self.tape.head(time.monotonic()) + 1
        while True:
            head = self.tape.head(time.monotonic())
            if next_n <= head and trades:
                batch = [trade(symbol, n) for n in range(next_n, head + 1) for symbol in trades]
                await conn.send_data(batch, [(t["S"], t["i"], t) for t in batch])
            next_n = max(next_n, head + 1)
            await sleep_until(self.tape.time_of(next_n))
