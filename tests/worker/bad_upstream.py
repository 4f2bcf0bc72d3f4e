"""A scripted `seqfeed/1` upstream for the bad-input catalogue: one behaviour per URL path.

`ws://127.0.0.1:PORT/case/<behaviour>` runs `BEHAVIOURS[behaviour]` for each connection. Most
send GOOD_BEFORE valid, contiguous frames after the subscriber's `after_seq`, then misbehave, so
a test can check that everything valid before the fault was delivered and nothing twice.
A second, raw TCP listener (`hang_url`) accepts connections and never answers the upgrade.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Self

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from leaseworker.protocol.seqfeed import MAX_FRAME_BYTES

GOOD_BEFORE = 3


def data(seq: Any, payload: Any = None, **extra: Any) -> str:
    return json.dumps({"type": "data", "seq": seq, "data": payload, **extra}, separators=(",", ":"))


async def subscribed_after(conn: ServerConnection) -> int:
    message = json.loads(await conn.recv())
    after: int = message["after_seq"]
    return after


async def good(conn: ServerConnection, after: int, count: int = GOOD_BEFORE) -> int:
    """Send `count` valid frames after `after`; return the next seq."""
    for seq in range(after + 1, after + 1 + count):
        await conn.send(data(seq, {"n": seq}))
    return after + 1 + count


def then(bad: Callable[[int], str | bytes]) -> Behaviour:
    """GOOD_BEFORE valid frames, then `bad(next_seq)`, then wait for the client to give up."""

    async def behaviour(conn: ServerConnection) -> None:
        after = await subscribed_after(conn)
        seq = await good(conn, after)
        await conn.send(bad(seq))
        await conn.wait_closed()

    return behaviour


def close_at_open(code: int) -> Behaviour:
    async def behaviour(conn: ServerConnection) -> None:
        await conn.close(code, "scripted close right after the handshake")

    return behaviour


def close_after_records(code: int) -> Behaviour:
    async def behaviour(conn: ServerConnection) -> None:
        after = await subscribed_after(conn)
        await good(conn, after)
        await conn.close(code, f"scripted close {code}")

    return behaviour


async def invalid_utf8(conn: ServerConnection) -> None:
    after = await subscribed_after(conn)
    await good(conn, after)
    await conn.send(b'{"type":"data","seq":0,"data":"\xff\xfe"}', text=True)  # a text frame, not UTF-8
    await conn.wait_closed()


async def overlapping_replay(conn: ServerConnection) -> None:
    """Ignores most of after_seq: replays up to 5 already-delivered frames, sends 10 new, closes."""
    after = await subscribed_after(conn)
    for seq in range(max(0, after - 4), after + 11):
        await conn.send(data(seq, {"n": seq}))
    await conn.close(1000, "scripted: batch done")


BIG_FRAME_BYTES = 100_000
LARGEST_FRAME_BYTES = MAX_FRAME_BYTES - 100  # just under the limit
FLOOD_BYTES = 300_000_000  # what a flood would put in memory if nothing pushed back


def big_frame(seq: int, size: int = BIG_FRAME_BYTES) -> str:
    head = f'{{"type":"data","seq":{seq},"data":{{"pad":"'
    return head + "x" * (size - len(head) - 3) + '"}}'


def flood(size: int) -> Behaviour:
    """Frames of `size` bytes as fast as the client lets them through (send waits for drain)."""

    async def behaviour(conn: ServerConnection) -> None:
        after = await subscribed_after(conn)
        for seq in range(after + 1, after + 1 + FLOOD_BYTES // size):
            await conn.send(big_frame(seq, size))
        await conn.wait_closed()

    return behaviour


Behaviour = Callable[[ServerConnection], Awaitable[None]]

BEHAVIOURS: dict[str, Behaviour] = {
    "close-at-open-1008": close_at_open(1008),
    "close-at-open-1013": close_at_open(1013),
    **{f"close-{code}": close_after_records(code) for code in (1000, 1001, 1008, 1011, 1013)},
    "binary": then(lambda seq: data(seq, {"n": seq}).encode()),
    "array": then(lambda seq: "[1,2,3]"),
    "null": then(lambda seq: "null"),
    "missing-seq": then(lambda seq: json.dumps({"type": "data", "data": 1})),
    "missing-data": then(lambda seq: json.dumps({"type": "data", "seq": seq})),
    "missing-type": then(lambda seq: json.dumps({"seq": seq, "data": 1})),
    "unknown-type": then(lambda seq: json.dumps({"type": "heartbeat", "seq": seq})),
    "seq-string": then(lambda seq: data(str(seq))),
    "seq-bool": then(lambda seq: data(True)),
    "seq-float": then(lambda seq: data(float(seq))),
    "negative-seq": then(lambda seq: data(-5)),
    "huge-seq": then(lambda seq: data(10**30)),
    "nan": then(lambda seq: f'{{"type":"data","seq":{seq},"data":NaN}}'),
    "infinity": then(lambda seq: f'{{"type":"data","seq":{seq},"data":[Infinity]}}'),
    "minus-infinity": then(lambda seq: f'{{"type":"data","seq":{seq},"data":{{"x":-Infinity}}}}'),
    "float-overflow": then(lambda seq: f'{{"type":"data","seq":{seq},"data":1e400}}'),
    "huge-int": then(lambda seq: f'{{"type":"data","seq":{seq},"data":{"9" * 5000}}}'),
    "deep-200": then(lambda seq: data(seq, json.loads("[" * 200 + "]" * 200))),
    "invalid-utf8": invalid_utf8,
    "overlapping-replay": overlapping_replay,
    "big-frames": flood(BIG_FRAME_BYTES),
    "largest-frames": flood(LARGEST_FRAME_BYTES),
}


class ScriptedUpstream:
    def __init__(self) -> None:
        self._server: Server | None = None
        self._hang: asyncio.Server | None = None
        self._hung: set[asyncio.StreamWriter] = set()
        self.opens: Counter[str] = Counter()  # websocket connections per behaviour

    async def __aenter__(self) -> Self:
        self._server = await serve(self._handle, "127.0.0.1", 0, compression=None, close_timeout=1)
        self._hang = await asyncio.start_server(self._never_upgrade, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for writer in self._hung:
            writer.transport.abort()
        for server in (self._server, self._hang):
            if server is not None:
                server.close()
                await server.wait_closed()

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def url(self, behaviour: str, *, scheme: str = "ws") -> str:
        return f"{scheme}://127.0.0.1:{self.port}/case/{behaviour}"

    @property
    def hang_url(self) -> str:
        assert self._hang is not None
        return f"ws://127.0.0.1:{self._hang.sockets[0].getsockname()[1]}/case/hang"

    async def _handle(self, conn: ServerConnection) -> None:
        assert conn.request is not None
        name = conn.request.path.rsplit("/", 1)[-1]
        self.opens[name] += 1
        with contextlib.suppress(ConnectionClosed):
            await BEHAVIOURS[name](conn)

    async def _never_upgrade(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.opens["hang"] += 1
        self._hung.add(writer)
        try:
            while await reader.read(4096):
                pass  # read the upgrade request, answer nothing
        finally:
            self._hung.discard(writer)
            writer.close()
