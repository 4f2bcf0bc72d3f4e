"""Opening an upstream socket that a stop can interrupt, its receive limits, and why it closed.

Memory per connection (process heap, worst case; docs/bad-input.md has the measurement):

- the websockets receive queue pauses reading once it holds more than MAX_QUEUE_FRAMES frames.
  Every frame already parsed from the last read is still queued, so it holds at most
  MAX_QUEUE_FRAMES whole frames plus one socket read (asyncio reads 256 KiB at a time);
- the frame parser holds at most one partial frame (< MAX_FRAME_BYTES);
- the session holds the frame it is decoding (its bytes, and a str of up to 4 bytes per code
  point) and one batch of at most BATCH_MAX_BYTES of frames (worker/batch.py) plus one frame,
  decoded into Python objects: typically 2-5 times the JSON's size, at worst ~24 times for
  frames made of empty containers (`[{},{},...]`);
- the sink serialises one batch at a time (the JSON lines, then their UTF-8 bytes).

With MAX_FRAME_BYTES = 1 MiB and MAX_QUEUE_FRAMES = 4: about 4.25 + 1 + 5 + 2 × (1 + decoding)
+ 2 MiB, i.e. ~15 MiB for ordinary JSON and ~60 MiB for adversarial containers. Kernel socket
buffers come on top (TCP autotuning, up to net.ipv4.tcp_rmem's maximum, charged to the
container's memory cgroup), and so does permessage-deflate's zlib state (~0.3 MiB) when the
upstream negotiates compression. A slow sink therefore backs up into the queue, then into TCP
flow control, then into the upstream: memory stays bounded.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from email.utils import parsedate_to_datetime
from typing import Any, Final

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import CloseCode
from websockets.typing import Subprotocol

from leaseworker.clock import monotonic, wall_time
from leaseworker.protocol.adapter import ConnectRequest

OPEN_TIMEOUT_SECONDS = 10.0  # TCP + TLS + HTTP upgrade; an upstream that never answers fails here
CLOSE_TIMEOUT_SECONDS = 2.0
MAX_QUEUE_FRAMES: Final = 4  # high-water mark of the receive queue; resumes at a quarter of it

# Closes that websockets sends itself when a frame breaks the protocol: protocol errors, not
# the upstream going away.
_PROTOCOL_CLOSES: Final[dict[int, str]] = {
    CloseCode.MESSAGE_TOO_BIG: "oversized frame (over the connection's max_frame_bytes)",
    CloseCode.INVALID_DATA: "invalid UTF-8 in a text frame",
    CloseCode.PROTOCOL_ERROR: "malformed websocket frame",
}


class TokenLapsed(Exception):
    """A connect's budget token lapsed before its upgrade could be sent (`ConnectRequest.send_by`):
    sent later, it might land in an upstream window that no longer counts its grant. On a busy
    loop a burst of connects reached the upstream over more than a second, and it refused them."""


def _sending_by(deadline: float) -> type[ClientConnection]:
    class SendingBy(ClientConnection):
        async def handshake(self, *args: Any, **kwargs: Any) -> None:
            late = monotonic() - deadline
            if late > 0:
                raise TokenLapsed(f"the upgrade was ready {late:.2f} s after its token's send-by time")
            await super().handshake(*args, **kwargs)

    return SendingBy


# Opens the socket a ConnectRequest describes, or None if the Event was set first.
SocketOpener = Callable[[ConnectRequest, asyncio.Event], Awaitable[ClientConnection | None]]


async def open_unless_stopped(request: ConnectRequest, stop: asyncio.Event) -> ClientConnection | None:
    """Open the socket `request` describes; None if `stop` was set first (a stop, a lost lease or
    shutdown). Connect errors (refused, TLS, a bad upgrade, the open timeout) are raised as they
    are; `refusal_status` tells an HTTP refusal (401, 403, 429) apart."""
    connecting = asyncio.ensure_future(
        connect(
            request.url,
            additional_headers=list(request.headers) or None,
            subprotocols=[Subprotocol(name) for name in request.subprotocols] or None,
            compression="deflate" if request.compression else None,
            open_timeout=OPEN_TIMEOUT_SECONDS,
            close_timeout=CLOSE_TIMEOUT_SECONDS,
            ping_interval=request.ping_interval_s,
            ping_timeout=request.ping_timeout_s,
            max_size=request.max_frame_bytes,
            max_queue=MAX_QUEUE_FRAMES,
            create_connection=_sending_by(request.send_by) if math.isfinite(request.send_by) else None,
        )
    )
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({connecting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not connecting.done():
            connecting.cancel()
            await asyncio.wait({connecting})  # unlike `await`, never raises the task's error
    if connecting.cancelled():
        return None
    return connecting.result()


def refusal_status(error: BaseException) -> int | None:
    """The HTTP status of a refused upgrade (InvalidStatus), else None."""
    if isinstance(error, InvalidStatus):
        return error.response.status_code
    return None


def refusal_retry_after(error: BaseException) -> float | None:
    """A refused upgrade's Retry-After in seconds (delta-seconds or an HTTP date), else None."""
    if not isinstance(error, InvalidStatus):
        return None
    value = error.response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value.strip()))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - wall_time())


def protocol_close(closed: ConnectionClosed) -> str | None:
    """If websockets itself closed the socket because a frame broke the protocol, say how."""
    sent = closed.sent
    if sent is not None and closed.rcvd_then_sent is not True:
        return _PROTOCOL_CLOSES.get(sent.code)
    return None


async def close_socket(ws: ClientConnection) -> None:
    """Close with 1001, bounded: a socket that does not finish its close handshake is aborted.

    What the upstream sends after our close is not read here. A session that stopped reading
    leaves its receive queue full, so the upstream's close frame waits behind those frames and
    the close ends at the timeout (2 s); such sockets are closed in the background
    (BackgroundCloses), so nothing waits for that. Reading them instead (tried on 2026-12-07)
    cost the fault suite more than the 2 s: on its loaded host every such close then read a
    replay's whole burst, sink timeouts went from 5 to 87 in a run, and handoffs took 3-8 s."""
    try:
        async with asyncio.timeout(CLOSE_TIMEOUT_SECONDS + 0.5):
            await ws.close(1001, "going away")
    except TimeoutError:
        ws.transport.abort()


class BackgroundCloses:
    """Sockets whose session has moved on (a reconnect after a sink error, a release) close here,
    and nothing waits for their close handshake but the worker's exit.

    A session that stopped reading a busy socket leaves its receive queue full, and the close
    then ends at its timeout (close_socket). Awaited in the session, those 2 s came before the
    reconnect, or before the release that a graceful handoff waits for: the fault suite's rolling
    restarts handed such connections over in 2.3-4.0 s against L2's 1.5 s (2026-12-07)."""

    def __init__(self) -> None:
        self._closing: dict[asyncio.Task[None], ClientConnection] = {}

    def close(self, ws: ClientConnection) -> None:
        task = asyncio.get_running_loop().create_task(close_socket(ws))
        self._closing[task] = ws
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._closing.pop(task, None)

    async def finish(self, timeout: float) -> None:
        """Wait up to `timeout` for the closes under way, then abort what is left: the exit stays
        within the shutdown's margin (each close is bounded by close_socket anyway)."""
        if self._closing:
            await asyncio.wait(set(self._closing), timeout=timeout)
        for task, ws in list(self._closing.items()):
            ws.transport.abort()
            task.cancel()
