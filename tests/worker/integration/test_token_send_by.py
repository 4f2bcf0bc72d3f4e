"""A connect's upgrade is never sent after its budget token's send-by time (worker/upstream.py).

The upstream counts a connect when its upgrade request arrives; the fleet's budget counts a grant
for its window plus the hold and the slack (lease/budget_store.py). On a loaded 2-core machine a
burst of 100 connects granted at once reached a local Jetstream replay over more than a second,
and the tail landed in a window that no longer counted its grant: 429s, then a 418 ban (CI,
tests/system/test_connect_budget.py). A real websockets server here counts the upgrades it sees.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from websockets.asyncio.server import ServerConnection, serve
from websockets.http11 import Request

from leaseworker.clock import monotonic
from leaseworker.lease.budget_store import HOLD_MS, SEND_BY_MS
from leaseworker.protocol.adapter import ConnectRequest
from leaseworker.worker.upstream import TokenLapsed, open_unless_stopped


async def upgrades_seen(send_by_in: float) -> tuple[int, BaseException | None]:
    seen: list[str] = []

    def count(_: ServerConnection, request: Request) -> None:
        seen.append(request.path)

    async def handler(ws: ServerConnection) -> None:
        await ws.wait_closed()

    async with serve(handler, "127.0.0.1", 0, process_request=count) as server:
        port = server.sockets[0].getsockname()[1]
        url = f"ws://127.0.0.1:{port}/feed"
        request = replace(ConnectRequest(url, url), send_by=monotonic() + send_by_in)
        error: BaseException | None = None
        try:
            ws = await open_unless_stopped(request, asyncio.Event())
            assert ws is not None
            await ws.close()
        except TokenLapsed as lapsed:
            error = lapsed
        await asyncio.sleep(0.05)
    return len(seen), error


def test_an_upgrade_past_its_send_by_time_is_never_sent() -> None:
    count, error = asyncio.run(upgrades_seen(-0.01))
    assert isinstance(error, TokenLapsed)
    assert count == 0


def test_an_upgrade_within_its_send_by_time_is_sent() -> None:
    count, error = asyncio.run(upgrades_seen(5.0))
    assert error is None
    assert count == 1


def test_without_a_budget_there_is_no_send_by_time() -> None:
    assert ConnectRequest("ws://x", "ws://x").send_by == float("inf")
    assert HOLD_MS < SEND_BY_MS  # a token is handed out only while its connect can still be sent
