"""A local replay of the atproto firehose (`com.atproto.sync.subscribeRepos`), from the spec.

Built from atproto.com/specs/event-stream and the subscribeRepos Lexicon, for tests and local
runs; it serves on 127.0.0.1 only:

- frames are binary: a DAG-CBOR header `{op: 1, t}` and a DAG-CBOR payload with an integer `seq`
  (CID links as tag 42, CAR `blocks` as bytes), or `{op: -1}` and `{error, message}`;
- seqs increase but are not contiguous (`append` can skip some);
- it keeps a backfill window of the last `retention` events (all of them when None);
- `?cursor=N`: no cursor streams from the live position; N above the last seq is a
  `FutureCursor` error and a close; N = 0 replays the whole window; N older than the window
  (an event after N was trimmed) sends `#info {name: "OutdatedCursor"}` first, then the whole
  window; otherwise it replays every retained event after N (`seq > N`, as the reference PDS
  does; `inclusive_cursor=True` sends `seq >= N`, as the spec's text reads), then goes live;
- a subscriber more than `max_backlog` frames behind gets `ConsumerTooSlow` and a close, as the
  PDS outbox does when its buffer fills;
- `big_commit_body` builds a `#commit` over 1 MiB that stays within the Lexicon's limits
  (`blocks` ≤ 1,000,000 bytes, ≤ 200 ops).

Run one by hand: `python -m leaseworker_atproto.replay_server --port 8765 --events 500 --rate 20`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from leaseworker_atproto.frames import Link, error_frame, message_frame

PATH: Final = "/xrpc/com.atproto.sync.subscribeRepos"
CONSUMER_TOO_SLOW: Final = "ConsumerTooSlow"
FUTURE_CURSOR: Final = "FutureCursor"
OUTDATED_CURSOR: Final = "OutdatedCursor"
DAG_CBOR: Final = 0x71
RAW: Final = 0x55
SHA2_256: Final = 0x12
MAX_BLOCKS: Final = 1_000_000  # the Lexicon's maxLength for a commit's `blocks`
MAX_OPS: Final = 200  # … and for its `ops`

_CLOSE: Final = b""  # the queue's "close now" marker (no real frame is empty)


def make_cid(data: bytes, codec: int = DAG_CBOR) -> Link:
    """A CIDv1 of `data`: version 1, the codec, a sha2-256 multihash (all varints below 128)."""
    return Link(bytes([1, codec, SHA2_256, 32]) + hashlib.sha256(data).digest())


def _time(seq: int) -> str:
    return f"2025-01-01T00:{seq // 60 % 60:02d}:{seq % 60:02d}.000Z"


def commit_body(seq: int, rng: random.Random, *, ops: int = 1, blocks: int = 300) -> dict[str, Any]:
    """A `#commit` payload (without `seq`, which `append` sets) shaped like the Lexicon's."""
    repo = f"did:plc:{rng.getrandbits(100):025x}"
    car = rng.randbytes(blocks)
    return {
        "rebase": False,
        "tooBig": False,
        "repo": repo,
        "commit": make_cid(car[:64] + seq.to_bytes(8, "big")),
        "rev": f"3l{seq:011d}",
        "since": None,
        "blocks": car,
        "ops": [
            {
                "action": "create",
                "path": f"app.bsky.feed.post/3l{seq:06d}{index:05d}",
                "cid": make_cid(car + index.to_bytes(2, "big")),
            }
            for index in range(ops)
        ],
        "blobs": [],
        "time": _time(seq),
    }


def big_commit_body(seq: int, rng: random.Random) -> dict[str, Any]:
    """A `#commit` whose frame is over 1 MiB: 1,000,000 bytes of blocks and 200 ops with long
    record keys (a record key may be 512 characters), all within the Lexicon's limits."""
    body = commit_body(seq, rng, ops=0, blocks=MAX_BLOCKS)
    body["ops"] = [
        {
            "action": "create",
            "path": f"app.bsky.feed.post/{'k' * 300}{index:05d}",
            "cid": make_cid(index.to_bytes(2, "big") + body["blocks"][:32]),
        }
        for index in range(MAX_OPS)
    ]
    return body


def sample_body(t: str, seq: int, rng: random.Random) -> dict[str, Any]:
    did = f"did:plc:{rng.getrandbits(100):025x}"
    if t == "#commit":
        return commit_body(seq, rng, ops=rng.randint(1, 3))
    if t == "#identity":
        return {"did": did, "time": _time(seq), "handle": f"user{seq}.bsky.social"}
    if t == "#account":
        return {"did": did, "time": _time(seq), "active": seq % 2 == 0}
    if t == "#sync":
        return {"did": did, "blocks": rng.randbytes(120), "rev": f"3l{seq:011d}", "time": _time(seq)}
    raise ValueError(f"no sample for {t}")


SAMPLE_TYPES: Final = ("#commit", "#commit", "#commit", "#identity", "#account", "#sync")


@dataclass(frozen=True, slots=True)
class Event:
    seq: int
    t: str
    frame: bytes


@dataclass(slots=True, eq=False)  # hashed by identity: a set of them
class _Subscriber:
    queue: asyncio.Queue[bytes] = field(default_factory=asyncio.Queue)
    dropped: bool = False
    sent: int = 0


@dataclass(frozen=True, slots=True)
class ConnectionLog:
    """What one client asked for, and how it was answered."""

    cursor: int | None
    answer: str  # "live", "replay", "outdated", "future", "bad_cursor"


class FirehoseReplayServer:
    """The firehose on 127.0.0.1: `start()`, `url`, `append(...)`, `close()`."""

    def __init__(
        self,
        *,
        retention: int | None = None,
        inclusive_cursor: bool = False,
        max_backlog: int = 10_000,
        port: int = 0,
    ) -> None:
        self.retention = retention
        self.inclusive_cursor = inclusive_cursor
        self.max_backlog = max_backlog
        self.disconnect_after: int | None = None  # close each socket after this many frames
        self.connections: list[ConnectionLog] = []
        self.frames_sent = 0
        self._port = port
        self._events: deque[Event] = deque()
        self._trimmed_through = 0  # the highest seq no longer retained (0: none trimmed)
        self._head = 0  # the last seq assigned
        self._subscribers: set[_Subscriber] = set()
        self._joined = asyncio.Event()
        self._server: Server | None = None

    # ------------------------------------------------------------------ the history

    @property
    def head(self) -> int:
        return self._head

    @property
    def oldest(self) -> int | None:
        return self._events[0].seq if self._events else None

    @property
    def subscribers(self) -> int:
        """The sockets now subscribed (backlog taken, live events queued for them)."""
        return len(self._subscribers)

    async def wait_subscribed(self, count: int = 1) -> None:
        while len(self._subscribers) < count:
            self._joined.clear()
            await self._joined.wait()

    def seqs(self) -> list[int]:
        return [event.seq for event in self._events]

    def append(self, t: str, body: Mapping[str, Any], *, skip: int = 0) -> Event:
        """Sequence an event (seq = the last + 1 + skip), keep it, and send it to every live
        subscriber."""
        if skip < 0:
            raise ValueError("skip must be >= 0")
        seq = self._head + 1 + skip
        self._head = seq
        event = Event(seq, t, message_frame(t, {**body, "seq": seq}))
        self._events.append(event)
        if self.retention is not None:
            self.trim(self.retention)
        for subscriber in list(self._subscribers):
            self._offer(subscriber, event.frame)
        return event

    def append_samples(self, count: int, *, seed: int = 1, max_skip: int = 3) -> list[Event]:
        """`count` events of mixed types, with random gaps between their seqs."""
        rng = random.Random(seed)
        added = []
        for _ in range(count):
            t = rng.choice(SAMPLE_TYPES)
            added.append(self.append(t, sample_body(t, self._head + 1, rng), skip=rng.randint(0, max_skip)))
        return added

    def trim(self, keep: int) -> None:
        """Keep only the last `keep` events: the backfill window moves on."""
        while len(self._events) > keep:
            self._trimmed_through = self._events.popleft().seq

    def info(self, name: str, message: str | None = None) -> None:
        """An `#info` notice (no seq, not retained) to every live subscriber."""
        body: dict[str, Any] = {"name": name}
        if message is not None:
            body["message"] = message
        for subscriber in list(self._subscribers):
            self._offer(subscriber, message_frame("#info", body))

    def kick(self, error: str, message: str | None = None) -> None:
        """An error frame, then a close, to every live subscriber."""
        for subscriber in list(self._subscribers):
            self._offer(subscriber, error_frame(error, message))
            self._offer(subscriber, _CLOSE)
            self._subscribers.discard(subscriber)

    def _offer(self, subscriber: _Subscriber, frame: bytes) -> None:
        if subscriber.dropped:
            return
        if frame and subscriber.queue.qsize() >= self.max_backlog:
            # The outbox's buffer is full: the consumer is too slow, tell it and drop it.
            subscriber.dropped = True
            self._subscribers.discard(subscriber)
            while not subscriber.queue.empty():
                subscriber.queue.get_nowait()
            subscriber.queue.put_nowait(error_frame(CONSUMER_TOO_SLOW, "Stream consumer too slow"))
            subscriber.queue.put_nowait(_CLOSE)
            return
        subscriber.queue.put_nowait(frame)

    # ------------------------------------------------------------------ serving

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the server is not started")
        port = self._server.sockets[0].getsockname()[1]
        return f"ws://127.0.0.1:{port}{PATH}"

    async def start(self) -> None:
        self._server = await serve(
            self._handle,
            "127.0.0.1",
            self._port,
            process_request=self._check_request,
            compression=None,
            max_size=64 * 1024,  # what a client may send: nothing, the stream is one-way
        )

    async def close(self) -> None:
        for subscriber in list(self._subscribers):
            subscriber.queue.put_nowait(_CLOSE)
        self._subscribers.clear()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> FirehoseReplayServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if urlsplit(request.path).path != PATH:
            return Response(HTTPStatus.NOT_FOUND.value, "Not Found", Headers(), b"not found\n")
        return None

    def _backlog(self, cursor: int | None) -> tuple[str, list[bytes]]:
        if cursor is None:
            return "live", []
        if cursor > self._head:
            return "future", [error_frame(FUTURE_CURSOR, "Cursor in the future.")]
        if cursor == 0:
            return "replay", [event.frame for event in self._events]
        if cursor < self._trimmed_through:
            notice = "Requested cursor exceeded limit. Possibly missing events"
            outdated = message_frame("#info", {"name": OUTDATED_CURSOR, "message": notice})
            return "outdated", [outdated, *(event.frame for event in self._events)]
        first = cursor if self.inclusive_cursor else cursor + 1
        return "replay", [event.frame for event in self._events if event.seq >= first]

    async def _handle(self, connection: ServerConnection) -> None:
        with contextlib.suppress(ConnectionClosed):  # the client left: nothing to tell it
            await self._serve(connection)

    async def _serve(self, connection: ServerConnection) -> None:
        values = parse_qs(urlsplit(connection.request.path if connection.request else "").query).get("cursor")
        cursor: int | None = None
        if values:
            try:
                cursor = int(values[-1])
                if cursor < 0:
                    raise ValueError("negative")
            except ValueError:
                self.connections.append(ConnectionLog(None, "bad_cursor"))
                await connection.send(error_frame("InvalidRequest", "cursor must be an integer >= 0"))
                await connection.close()
                return
        # The backlog and the subscription are taken in one step (no await between them), so
        # every event is either in the backlog or in the queue: none lost, none twice.
        answer, backlog = self._backlog(cursor)
        self.connections.append(ConnectionLog(cursor, answer))
        subscriber = _Subscriber()
        if answer == "future":
            await self._send(connection, subscriber, backlog)
            await connection.close()
            return
        self._subscribers.add(subscriber)
        self._joined.set()
        try:
            if not await self._send(connection, subscriber, backlog):
                return
            while True:
                frame = await subscriber.queue.get()
                if frame == _CLOSE or not await self._send(connection, subscriber, [frame]):
                    break
        finally:
            self._subscribers.discard(subscriber)
            with contextlib.suppress(Exception):
                await connection.close()

    async def _send(
        self, connection: ServerConnection, subscriber: _Subscriber, frames: Sequence[bytes]
    ) -> bool:
        """Send frames; False once the socket should end (`disconnect_after` reached)."""
        for frame in frames:
            await connection.send(frame)
            self.frames_sent += 1
            subscriber.sent += 1
            if self.disconnect_after is not None and subscriber.sent >= self.disconnect_after:
                return False
        return True


async def _serve_forever(port: int, events: int, retention: int | None, rate: float) -> None:
    server = FirehoseReplayServer(retention=retention, port=port)
    server.append_samples(events)
    rng = random.Random(2)
    async with server:
        print(f"firehose replay on {server.url} (seqs {server.oldest}..{server.head})", flush=True)
        while True:
            await asyncio.sleep(1 / rate if rate > 0 else 3600)
            if rate > 0:
                t = rng.choice(SAMPLE_TYPES)
                server.append(t, sample_body(t, server.head + 1, rng), skip=rng.randint(0, 3))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--events", type=int, default=500, help="events in the history at start")
    parser.add_argument("--retention", type=int, default=None, help="events kept for replay")
    parser.add_argument("--rate", type=float, default=10.0, help="new events per second (0: none)")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_forever(args.port, args.events, args.retention, args.rate))


if __name__ == "__main__":
    main()
