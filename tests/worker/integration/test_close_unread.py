"""Closing a socket that nothing reads any more still completes the close handshake
(worker/rotation.py `close_socket`).

After a protocol error, a sink error, a session crash or a rotation, the session stops reading
the old socket and closes it. A busy upstream has sent on meanwhile: its frames fill the receive
queue (upstream.MAX_QUEUE_FRAMES), websockets pauses reading, and the upstream's close frame waits
behind them. Before the fix, every such close ran into the close timeout and was aborted: 2 s per
reconnect, which made the bad-input catalogue's sink-crash case miss its fifth crash on a loaded
host. A real websockets server here floods frames until it sees our close.
"""

from __future__ import annotations

import asyncio

from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from leaseworker.worker import upstream
from leaseworker.worker.rotation import close_socket

FRAME = "x" * 2000


async def close_after_flood(*, unread: bool) -> tuple[int | None, int | None]:
    """(the close code the client received from the server, the code the server received)."""
    server_saw: list[int | None] = []

    async def flood(ws: ServerConnection) -> None:
        try:
            while True:
                await ws.send(FRAME)
                await asyncio.sleep(0)  # the client shares this event loop
        except ConnectionClosed:
            pass
        server_saw.append(ws.close_code)

    async with serve(flood, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        ws = await connect(
            f"ws://127.0.0.1:{port}/feed",
            max_queue=upstream.MAX_QUEUE_FRAMES,
            close_timeout=upstream.CLOSE_TIMEOUT_SECONDS,
        )
        await ws.recv()
        await asyncio.sleep(0.3)  # the queue fills and reading pauses
        assert ws.transport.is_reading() is False, "the receive queue never paused reading"
        await close_socket(ws, unread=unread)
        received = ws.protocol.close_rcvd.code if ws.protocol.close_rcvd is not None else None
        for _ in range(100):
            if server_saw:
                break
            await asyncio.sleep(0.01)
    return received, server_saw[0] if server_saw else None


def test_an_unread_socket_completes_its_close_handshake() -> None:
    received, server_saw = asyncio.run(close_after_flood(unread=True))
    assert received == 1001  # the server's reply came back: not aborted at the close timeout
    assert server_saw == 1001


def test_a_socket_whose_reader_is_gone_and_left_unread_is_aborted() -> None:
    # The negative control: what a reader-still-running close (`unread=False`) does if nothing
    # reads after all. The server's close frame never gets past the paused queue.
    received, _ = asyncio.run(close_after_flood(unread=False))
    assert received is None
