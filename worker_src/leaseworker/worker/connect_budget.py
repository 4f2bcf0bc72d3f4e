"""The connect path's budget hooks (worker/socket_run.py): which budget a connect draws on, the
wait for its token (kept interruptible by a stop or a lost lease), and a refusal's back-off."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from leaseworker.lease.budget_store import host_key
from leaseworker.worker.budget import Limit, priority_of
from leaseworker.worker.session import ConnectionSession

FLEET_REFUSALS = frozenset({429, 418})  # the upstream limits the client address: the whole fleet
ROTATION_WAIT_S = 2.0


def limit_of(session: ConnectionSession, url: str) -> Limit | None:
    """The connection's budget (generic/1 `budget`), None when it has none or the worker runs
    without budgets."""
    if session.deps.budgets is None:
        return None
    config: Any = getattr(session.protocol, "config", None)
    budget = getattr(config, "budget", None)
    if budget is None:
        return None
    return Limit(budget.host or host_key(url), int(budget.count), float(budget.seconds))


async def wait_for_token(
    session: ConnectionSession, limit: Limit | None, *, rotation: bool = False
) -> float | None:
    """Wait for a token (the lease stays held meanwhile); the monotonic time by which the
    connect's upgrade must be sent (inf without a budget). None if the session is stopping, or
    for a rotation, if no token came within ROTATION_WAIT_S: the old socket still delivers and
    the socket loop must not stall behind the budget (the rotation is skipped, not forced)."""
    budgets = session.deps.budgets
    if limit is None or budgets is None:
        return math.inf
    priority = priority_of("rotation" if rotation else session.open_reason)
    taking = asyncio.ensure_future(budgets.acquire(limit, priority))
    stopped = asyncio.ensure_future(session.stop_requested.wait())
    try:
        await asyncio.wait(
            {taking, stopped},
            timeout=ROTATION_WAIT_S if rotation else None,
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        stopped.cancel()
        if not taking.done():
            taking.cancel()
            await asyncio.wait({taking})
    if taking.cancelled():
        return None
    send_by = taking.result()  # a bug in the budget surfaces as the session's crash, contained there
    return None if session.stopping() else send_by


async def obey_refusal(
    session: ConnectionSession, limit: Limit | None, status: int, retry_after: float | None
) -> None:
    """A 429 or a 418 backs the host off for the fleet; any other refusal (Alpaca's 406, a 401)
    is this connection's own, and its session's backoff handles it."""
    budgets = session.deps.budgets
    if limit is not None and budgets is not None and status in FLEET_REFUSALS:
        await budgets.refused(limit, status, retry_after)
