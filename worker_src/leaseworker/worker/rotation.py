"""Make-before-break rotation (`lifetime.max_age_s`, docs/design.md §4.2): the successor socket.

A feed that cuts its sockets at a fixed age (Binance at 24 h) is rotated before it does: a new
socket is opened and its open steps (auth, subscribe, ack) are done while the old one still
delivers. Only once the successor is Ready does the caller (worker/socket_actions.py) close the old
socket and switch; the successor's records that the old socket already delivered are told apart
by their ordered cursor there, and what cannot be told apart carries the adapter's `rotation`
gap marker. Frames the successor receives before its switch are kept, in order, as its pending
actions.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from leaseworker.clock import monotonic, wall_ns
from leaseworker.observability.logging import get_logger
from leaseworker.protocol.adapter import Action, Fail, Ready, Reconnect, Release, Send, SocketAdapter
from leaseworker.secret_references import redact
from leaseworker.worker import upstream
from leaseworker.worker.session import ConnectionSession

logger = get_logger(__name__)


def _wall_ms() -> int:
    return wall_ns() // 1_000_000


async def open_successor(
    session: ConnectionSession,
    new_adapter: Callable[[dict[str, str]], SocketAdapter],
    *,
    send_by: float = math.inf,
) -> tuple[ClientConnection, SocketAdapter, list[Action]] | None:
    """The successor socket, Ready, with the actions its frames produced so far; None if it
    could not be opened or readied within the open timeout (the old socket then carries on).
    `send_by` is its budget token's (upstream.TokenLapsed): a lapsed token skips the rotation."""
    protocol = session.protocol
    assert protocol is not None
    refs = protocol.references()
    values: dict[str, str] = {}
    try:
        values = await session.deps.references.resolve(refs) if refs else {}
        adapter = new_adapter(values)
        request = replace(adapter.connect_request(), send_by=send_by)
        new = await session.deps.open_socket(request, session.stop_requested)
    except Exception as error:
        shown = redact(str(error), values.values())  # a URL in the error may hold a resolved value
        logger.warning("rotation: the successor did not open; keeping the old socket", extra={"error": shown})
        return None
    if new is None:
        return None
    pending: list[Action] = []
    try:
        async with asyncio.timeout(upstream.OPEN_TIMEOUT_SECONDS):
            ready = await _handshake(new, adapter, pending)
    except (TimeoutError, ConnectionClosed):
        ready = False
    if not ready:
        logger.warning("rotation: the successor was not ready; keeping the old socket")
        session.deps.closes.close(new)  # the old socket's reading does not wait for this close
        return None
    return new, adapter, pending


async def _handshake(ws: ClientConnection, adapter: SocketAdapter, pending: list[Action]) -> bool:
    """Run the successor's open steps until Ready (True) or a refusal (False)."""
    actions: Sequence[Action] = adapter.on_open(monotonic(), _wall_ms())
    while True:
        for action in actions:
            if isinstance(action, Send):
                await ws.send(action.frame)
            elif isinstance(action, Reconnect | Fail | Release):
                return False
            elif not isinstance(action, Ready):
                pending.append(action)
        if any(isinstance(action, Ready) for action in actions):
            return True
        timer = adapter.next_timer()
        try:
            async with asyncio.timeout(None if timer is None else max(0.0, timer - monotonic())):
                raw = await ws.recv()
        except TimeoutError:
            actions = adapter.on_timer(monotonic(), _wall_ms())
            continue
        actions = adapter.on_frame(raw, monotonic(), _wall_ms())
