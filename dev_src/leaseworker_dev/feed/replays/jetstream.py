"""A local Bluesky Jetstream (`/subscribe`), from its public documentation:
https://github.com/bluesky-social/jetstream (README, "Consuming Jetstream") and
https://docs.bsky.app/blog/jetstream.

- `GET /subscribe?wantedCollections=…&wantedDids=…&cursor=<time_us>` (repeated query params).
  Collections filter commit events only (NSIDs, or prefixes like `app.bsky.graph.*`): "regardless
  of desired collections, all subscribers receive Account and Identity events"; DIDs filter all.
- Events are JSON: `{"did", "time_us", "kind": "commit"|"identity"|"account", …}`, `time_us` unix
  microseconds, strictly increasing on one instance.
- `cursor`: "a unix microseconds timestamp cursor to begin playback from": events with
  time_us >= cursor are replayed (inclusive), then the live tail. "An absent cursor or a cursor
  from the future will result in live-tail operation." A cursor older than the retained history
  starts at the oldest retained event (`retain` events are kept, default all).
- No application heartbeat: the socket's WebSocket pings are the only keepalive.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

from websockets.http11 import Request, Response

from leaseworker_dev.feed.replays.base import Conn, Feed, ReplayServer, http_error, register, sleep_until

DIDS = ("did:plc:replayalice000000000000", "did:plc:replaybob00000000000000", "did:plc:replaycarol0000000000")
COLLECTIONS = ("app.bsky.feed.post", "app.bsky.feed.like", "app.bsky.graph.follow")


@register
class Jetstream(Feed):
    name: ClassVar[str] = "jetstream"
    ws_path: ClassVar[str] = "/subscribe"

    def __init__(self, server: ReplayServer, *, retain: int | None = None) -> None:
        super().__init__(server)
        self.retain = retain
        self.tape = server.tape()
        self.t0_us = server.t0_wall_ms * 1000

    def time_us(self, n: int) -> int:
        # Strictly increasing as long as rate <= 1e6 per second.
        return self.t0_us + (n * 1_000_000) // max(1, round(self.tape.rate))

    def first_at_or_after(self, cursor: int) -> int:
        """The first n whose time_us >= cursor."""
        rate = max(1, round(self.tape.rate))
        n = max(0, ((cursor - self.t0_us) * rate) // 1_000_000)
        while n > 0 and self.time_us(n - 1) >= cursor:
            n -= 1
        while self.time_us(n) < cursor:
            n += 1
        return n

    def oldest(self, head: int) -> int:
        return 0 if self.retain is None else max(0, head - self.retain + 1)

    def refuse(self, request: Request) -> Response | None:
        split = urlsplit(request.path)
        if split.path.rstrip("/") != "/subscribe":
            return http_error(404, "not found")
        query = parse_qs(split.query)
        if len(query.get("wantedCollections", [])) > 100:
            return http_error(400, "too many wanted collections (at most 100)")
        if "cursor" in query:
            try:
                int(query["cursor"][-1])
            except ValueError:
                return http_error(400, "cursor must be an integer (unix microseconds)")
        return None

    @staticmethod
    def event(n: int, time_us: int) -> dict[str, Any]:
        did = DIDS[n % len(DIDS)]
        if n % 10 == 7:
            return {
                "did": did,
                "time_us": time_us,
                "kind": "identity",
                "identity": {"did": did, "handle": f"replay{n % len(DIDS)}.bsky.social", "seq": n},
            }
        if n % 10 == 9:
            return {
                "did": did,
                "time_us": time_us,
                "kind": "account",
                "account": {"active": True, "did": did},
            }
        collection = COLLECTIONS[n % len(COLLECTIONS)]
        return {
            "did": did,
            "time_us": time_us,
            "kind": "commit",
            "commit": {
                "rev": f"3l{n:011d}",
                "operation": "create",
                "collection": collection,
                "rkey": f"3k{n:011d}",
                "record": {"$type": collection, "createdAt": "2024-09-05T06:11:04.870Z", "n": n},
                "cid": f"bafyreireplay{n:020d}",
            },
        }

    @staticmethod
    def wanted(event: dict[str, Any], collections: list[str], dids: set[str]) -> bool:
        if dids and event["did"] not in dids:
            return False
        if event["kind"] != "commit" or not collections:
            return True
        name: str = event["commit"]["collection"]
        return any(name.startswith(c[:-1]) if c.endswith(".*") else name == c for c in collections)

    async def session(self, conn: Conn) -> None:
        query = parse_qs(urlsplit(conn.path).query)
        collections = query.get("wantedCollections", [])
        dids = set(query.get("wantedDids", []))
        head = self.tape.head(time.monotonic())
        next_n = head + 1
        if "cursor" in query:
            cursor = int(query["cursor"][-1])
            start = self.first_at_or_after(cursor)
            if start <= head:  # a cursor from the future is a live tail
                next_n = max(start, self.oldest(head))
        while True:
            head = self.tape.head(time.monotonic())
            while next_n <= head:
                event = self.event(next_n, self.time_us(next_n))
                if self.wanted(event, collections, dids):
                    await conn.send_data(event, [(None, event["time_us"], event)])
                next_n += 1
            await sleep_until(self.tape.time_of(next_n))
