"""A local Kraken Spot WebSocket API v2 (wss://ws.kraken.com/v2), from its public
documentation: https://docs.kraken.com/api/docs/websocket-v2/trade,
https://docs.kraken.com/api/docs/websocket-v2/heartbeat, https://docs.kraken.com/api/docs/websocket-v2/status,
https://docs.kraken.com/api/docs/websocket-v2/ping.

- On connect the server sends the status channel's update:
  `{"channel": "status", "type": "update", "data": [{"api_version": "v2", "connection_id",
  "system": "online", "version"}]}`.
- Subscribe: `{"method": "subscribe", "params": {"channel": "trade", "symbol": [...],
  "snapshot": bool}, "req_id": n}`; one acknowledgement per symbol, `{"method": "subscribe",
  "result": {"channel", "symbol", "snapshot"}, "success": true, "time_in", "time_out",
  "req_id"}`, or `{"method": "subscribe", "success": false, "error": "...", "symbol", …}`.
- Trades: `{"channel": "trade", "type": "snapshot" | "update", "data": [{"symbol", "side",
  "price", "qty", "ord_type", "trade_id", "timestamp"}]}`; the snapshot (default true for the
  trade channel) is the most recent 50 trades; "trade identifier is a sequence number, unique
  per book".
- Heartbeat: `{"channel": "heartbeat"}` "approximately once every second in the absence of any
  other channel updates", once subscribed to any channel.
- Ping: `{"method": "ping", "req_id"}` → `{"method": "pong", "req_id", "time_in", "time_out"}`.
- It cannot replay (the snapshot is the only look back).
"""

from __future__ import annotations

import itertools
import re
import time
from typing import Any, ClassVar

from leaseworker_dev.feed.replays.base import (
    Conn,
    Feed,
    ReplayServer,
    Tape,
    iso,
    register,
    run_until_first,
    sleep_until,
    wall_ms,
)

SNAPSHOT_TRADES = 50
TRADE_ID_BASE = 80_000_000
_SYMBOL = re.compile(r"[A-Z0-9]{2,10}/[A-Z0-9]{2,10}")
UNSUPPORTED = frozenset({"XXX/YYY"})  # a pair the replay says it does not list


def trade(symbol: str, n: int) -> dict[str, Any]:
    return {
        "symbol": symbol,
        "side": "buy" if n % 3 else "sell",
        "price": 60000.0 + n % 400 + 0.1,
        "qty": round(0.001 * ((n % 50) + 1), 8),
        "ord_type": "limit" if n % 4 else "market",
        "trade_id": TRADE_ID_BASE + n,
        "timestamp": iso(wall_ms()),
    }


@register
class Kraken(Feed):
    name: ClassVar[str] = "kraken-v2"
    ws_path: ClassVar[str] = "/v2"

    def __init__(self, server: ReplayServer) -> None:
        super().__init__(server)
        self.tape: Tape = server.tape()
        self.connection_ids = itertools.count(14_000_000_000_000_000)

    async def session(self, conn: Conn) -> None:
        await conn.send(
            {
                "channel": "status",
                "type": "update",
                "data": [
                    {
                        "api_version": "v2",
                        "connection_id": next(self.connection_ids),
                        "system": "online",
                        "version": "2.0.9",
                    }
                ],
            }
        )
        subscribed: dict[str, int] = {}  # trade symbol -> next n to send
        await run_until_first(self.requests(conn, subscribed), self.pump(conn, subscribed))

    async def requests(self, conn: Conn, subscribed: dict[str, int]) -> None:
        while True:
            request = await conn.recv_json()
            time_in = iso(wall_ms())
            if not isinstance(request, dict):
                await conn.send({"error": "Malformed request", "success": False, "time_in": time_in})
                continue
            method = request.get("method")
            reply: dict[str, Any] = {"method": method, "time_in": time_in}
            if "req_id" in request:
                reply["req_id"] = request["req_id"]
            if method == "ping":
                await conn.send({**reply, "method": "pong", "time_out": iso(wall_ms())})
            elif method == "subscribe":
                await self.subscribe(conn, request.get("params"), reply, subscribed)
            else:
                await conn.send({**reply, "success": False, "error": f"Unsupported method {method}"})

    async def subscribe(
        self, conn: Conn, params: Any, reply: dict[str, Any], subscribed: dict[str, int]
    ) -> None:
        if not isinstance(params, dict) or params.get("channel") != "trade":
            channel = params.get("channel") if isinstance(params, dict) else None
            await conn.send(
                {**reply, "success": False, "error": f"Channel {channel} not supported by the replay"}
            )
            return
        symbols = params.get("symbol")
        if not isinstance(symbols, list) or not symbols:
            await conn.send({**reply, "success": False, "error": "Missing field symbol"})
            return
        snapshot = params.get("snapshot", True) is not False
        head = self.tape.head(time.monotonic())
        for symbol in symbols:
            if not isinstance(symbol, str) or not _SYMBOL.fullmatch(symbol) or symbol in UNSUPPORTED:
                await conn.send(
                    {
                        **reply,
                        "success": False,
                        "symbol": symbol,
                        "error": f"Currency pair not supported {symbol}",
                    }
                )
                continue
            result = {"channel": "trade", "snapshot": snapshot, "symbol": symbol}
            await conn.send({**reply, "result": result, "success": True, "time_out": iso(wall_ms())})
            if symbol in subscribed:
                continue
            if snapshot and head >= 0:
                trades = [trade(symbol, n) for n in range(max(0, head - SNAPSHOT_TRADES + 1), head + 1)]
                message = {"channel": "trade", "type": "snapshot", "data": trades}
                await conn.send_data(message, [(symbol, t["trade_id"], t) for t in trades])
            subscribed[symbol] = head + 1

    async def pump(self, conn: Conn, subscribed: dict[str, int]) -> None:
        while True:
            now = time.monotonic()
            head = self.tape.head(now)
            for symbol, next_n in list(subscribed.items()):
                if next_n <= head:
                    trades = [trade(symbol, n) for n in range(next_n, head + 1)]
                    message = {"channel": "trade", "type": "update", "data": trades}
                    await conn.send_data(message, [(symbol, t["trade_id"], t) for t in trades])
                    subscribed[symbol] = head + 1
            if subscribed and now - conn.last_send >= 1.0:
                await conn.send({"channel": "heartbeat"})
            await sleep_until(min(self.tape.time_of(head + 1), conn.last_send + 1.0))
