"""A local Coinbase Exchange market data feed (ws-feed.exchange.coinbase.com), from its public
documentation: https://docs.cdp.coinbase.com/exchange/websocket-feed (protocol, subscribe,
errors) and https://docs.cdp.coinbase.com/exchange/websocket-feed/channels (heartbeat, matches).

- Every message is a JSON object with a `type`. The client must send
  `{"type": "subscribe", "product_ids": [...], "channels": [name | {"name", "product_ids"}]}`:
  "you are disconnected if no subscribe has been received within 5 seconds".
- The server answers `{"type": "subscriptions", "channels": [{"name", "product_ids"}]}`; a bad
  request gets `{"type": "error", "message": "Failed to subscribe", "reason": …}`.
- `matches`: after subscribing, one `last_match` per product (the most recent trade), then a
  `match` per trade. `trade_id` is consecutive per product; `sequence` increases per product
  with holes (the other order messages of the full channel are not sent on matches).
- `heartbeat`: one `{"type": "heartbeat", "sequence", "last_trade_id", "product_id", "time"}`
  per product each second.
- It cannot replay: trades made while no one listened are never sent.
"""

from __future__ import annotations

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

PRODUCTS = ("BTC-USD", "ETH-USD", "SOL-USD", "ETH-EUR", "BTC-EUR")
CHANNELS = frozenset({"matches", "heartbeat", "ticker", "status", "level2_batch", "full"})
TRADE_ID_BASE = 500_000  # trade n of a product has trade_id TRADE_ID_BASE + n
SEQUENCE_PER_TRADE = 7  # sequence numbers per trade on the full channel (received, open, done, …)


def trade_id(n: int) -> int:
    return TRADE_ID_BASE + n


def match(product: str, n: int, kind: str = "match") -> dict[str, Any]:
    return {
        "type": kind,
        "trade_id": trade_id(n),
        "maker_order_id": f"ac928c66-ca53-498f-9c13-{n:012d}",
        "taker_order_id": f"b7d2f6e9-0f9c-4a4b-8a0e-{n:012d}",
        "side": "buy" if n % 2 else "sell",
        "size": f"0.{(n % 97) + 1:04d}",
        "price": f"{30000 + (n % 500)}.{n % 100:02d}",
        "product_id": product,
        "sequence": 50_000_000 + n * SEQUENCE_PER_TRADE,
        "time": iso(wall_ms()),
    }


@register
class Coinbase(Feed):
    name: ClassVar[str] = "coinbase-exchange"

    def __init__(self, server: ReplayServer, *, subscribe_timeout: float = 5.0) -> None:
        super().__init__(server)
        self.subscribe_timeout = subscribe_timeout
        self.tape: Tape = server.tape()  # every product trades at `rate`, from the same t0

    async def session(self, conn: Conn) -> None:
        try:
            request = await conn.recv_json(self.subscribe_timeout)
        except TimeoutError:
            await conn.close(1008, "subscribe timeout")  # "disconnected … within 5 seconds"
            return
        channels, error = self.parse(request)
        if error is not None:
            await conn.send({"type": "error", "message": "Failed to subscribe", "reason": error})
            await conn.close(1008, "failed to subscribe")
            return
        await conn.send(
            {
                "type": "subscriptions",
                "channels": [{"name": name, "product_ids": ids} for name, ids in channels.items()],
            }
        )
        await run_until_first(self.pump(conn, channels), self.ignore_client(conn))

    @staticmethod
    def parse(request: Any) -> tuple[dict[str, list[str]], str | None]:
        if not isinstance(request, dict) or request.get("type") != "subscribe":
            return {}, "first message must be a subscribe"
        default = request.get("product_ids", [])
        raw_channels = request.get("channels")
        if not isinstance(default, list) or not isinstance(raw_channels, list) or not raw_channels:
            return {}, "product_ids and channels must be lists"
        channels: dict[str, list[str]] = {}
        for item in raw_channels:
            name, ids = (
                (item, default)
                if isinstance(item, str)
                else (item.get("name"), item.get("product_ids", default))
            )
            if name not in CHANNELS:
                return {}, f"{name} is not a valid channel"
            if not ids or not isinstance(ids, list):
                return {}, f"You need to specify at least one product ID for channel {name}"
            for product in ids:
                if product not in PRODUCTS:
                    return {}, f"{product} is not a valid product"
            channels[name] = list(dict.fromkeys(ids))
        return channels, None

    async def pump(self, conn: Conn, channels: dict[str, list[str]]) -> None:
        matches = channels.get("matches", [])
        beats = channels.get("heartbeat", [])
        head = self.tape.head(time.monotonic())
        for product in matches:  # last_match: the most recent trade, before the live ones
            if head >= 0:
                message = match(product, head, "last_match")
                await conn.send_data(message, [(product, message["trade_id"], message)])
        next_n = head + 1
        next_beat = time.monotonic() + 1.0
        while True:
            now = time.monotonic()
            head = self.tape.head(now)
            while next_n <= head:
                for product in matches:
                    message = match(product, next_n)
                    await conn.send_data(message, [(product, message["trade_id"], message)])
                next_n += 1
            if now >= next_beat:
                next_beat += 1.0
                for product in beats:
                    await conn.send(
                        {
                            "type": "heartbeat",
                            "sequence": 50_000_000 + max(head, 0) * SEQUENCE_PER_TRADE + 3,
                            "last_trade_id": trade_id(head),
                            "product_id": product,
                            "time": iso(wall_ms()),
                        }
                    )
            await sleep_until(min(self.tape.time_of(next_n), next_beat))

    @staticmethod
    async def ignore_client(conn: Conn) -> None:
        async for _ in conn.ws:  # later subscribes are not modelled; reading notices the close
            pass
