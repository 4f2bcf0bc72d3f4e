"""Connect tokens for one worker: a small local cache per upstream host in front of the fleet's
budget item (lease/budget_store.py), handed out by priority.

Every connect of a budgeted connection takes a token first (docs/design.md §4.2): a first
subscribe, a reconnect, a takeover, a handoff, a rotation. The session keeps its lease while it
waits: it is owned and running (its task is in the registry), it only has no socket yet, and a
feed that cannot replay marks the wait in the gap marker of its next connect, as for any
reconnect (§4.3).

Priority: a takeover or a handoff (a connection that was being served a moment ago) goes first;
reconnects and rotations next; a fresh cold start (no checkpoint yet) last. Within a worker the
waiters are served in that order; across the fleet an urgent taker marks the item and cold
starts take nothing until the mark lapses.

Refusals: an HTTP 429 or 418 backs the host off for the whole fleet (written into the item, for
Retry-After or, without one, RATE_LIMITED_BACKOFF_S / BANNED_BACKOFF_S); the cached tokens are
dropped. A per-connection refusal (a 406, a limit close) is that session's own backoff.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from leaseworker.clock import monotonic
from leaseworker.lease.budget_store import HOLD_MS, SEND_BY_MS, BudgetStore, now_ms
from leaseworker.lease.errors import StoreError
from leaseworker.observability.logging import get_logger
from leaseworker.observability.metrics import MetricName, WorkerMetrics

logger = get_logger(__name__)

URGENT, RECONNECT, COLD = 0, 1, 2  # priorities: lower goes first
RATE_LIMITED_BACKOFF_S: Final = 60.0  # a 429 without Retry-After: at least this, and a window
BANNED_BACKOFF_S: Final = 300.0  # a 418 (an IP ban) without Retry-After
MAX_RETRY_AFTER_S: Final = 3 * 24 * 3600.0  # Binance bans for up to 3 days
STORE_RETRY_S: Final = 1.0


def priority_of(open_reason: str, *, handoff: bool = False) -> int:
    if handoff or open_reason == "takeover":
        return URGENT
    if open_reason == "connect":
        return COLD
    return RECONNECT


@dataclass(frozen=True, slots=True)
class Limit:
    host: str
    count: int
    seconds: float

    def per_take(self, waiting: int) -> int:
        """Tokens one take asks for: one per connect waiting here, never more (a token nobody
        takes is budget lost for a window), so a takeover of N connections takes its tokens in
        ceil(N / count) writes, and a lone reconnect in one."""
        return max(1, min(waiting, self.count))


@dataclass(order=True)
class _Waiter:
    priority: int
    order: int
    granted: asyncio.Future[float] = field(compare=False)  # the token's send-by time


class _Host:
    def __init__(self, limit: Limit) -> None:
        self.limit = limit
        self.cached: list[tuple[float, float]] = []  # each cached token's (use by, send by), monotonic
        self.waiters: list[_Waiter] = []
        self.pump: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()
        self.backed_off_until_ms = 0


class ConnectBudgets:
    """One per worker process: the hosts' caches and waiters."""

    def __init__(
        self, store: BudgetStore, metrics: WorkerMetrics, *, clock: Callable[[], float] = monotonic
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._clock = clock
        self._hosts: dict[str, _Host] = {}
        self._order = itertools.count()
        self.write_units = 0.0  # consumed by takes so far (the cost figures, tests)
        self.read_units = 0.0
        self.granted = 0

    async def acquire(self, limit: Limit, priority: int) -> float:
        """Wait for one token for a connect to `limit.host`; returns the monotonic time by which
        the connect's upgrade must be sent (its grant counts against the upstream's window only
        so long: upstream.TokenLapsed). Cancel it (a stop, a lost lease) to leave the queue: a
        token it was given is not lost to the fleet's count, only unused."""
        host = self._hosts.get(limit.host)
        if host is None:
            host = self._hosts[limit.host] = _Host(limit)
        host.limit = limit
        started = self._clock()
        if not host.waiters and (send_by := self._use_cached(host)) is not None:
            return send_by
        waiter = _Waiter(priority, next(self._order), asyncio.get_running_loop().create_future())
        heapq.heappush(host.waiters, waiter)
        if host.pump is None or host.pump.done():
            host.pump = asyncio.create_task(self._pump(host), name=f"budget {limit.host}")
        host.wake.set()
        try:
            send_by = await waiter.granted
        except asyncio.CancelledError:
            if waiter in host.waiters:
                host.waiters.remove(waiter)
                heapq.heapify(host.waiters)
            raise
        waited = self._clock() - started
        self._metrics.count(MetricName.ConnectsDeferred)
        self._metrics.observe(MetricName.BudgetWaitSeconds, waited)
        logger.debug("connect waited for the host's budget", extra={"host": limit.host, "wait_s": waited})
        return send_by

    def _use_cached(self, host: _Host) -> float | None:
        """A cached token's send-by time, or None if none is left that may still be used."""
        now = self._clock()
        host.cached = [token for token in host.cached if token[0] > now]
        return host.cached.pop()[1] if host.cached else None

    async def refused(self, limit: Limit, status: int, retry_after_s: float | None) -> None:
        """The upstream refused a connect with 429 or 418: back the host off for the fleet."""
        default = BANNED_BACKOFF_S if status == 418 else max(RATE_LIMITED_BACKOFF_S, limit.seconds)
        seconds = min(MAX_RETRY_AFTER_S, retry_after_s if retry_after_s is not None else default)
        until = now_ms() + int(seconds * 1000)
        host = self._hosts.get(limit.host)
        if host is not None:
            host.cached.clear()
            host.backed_off_until_ms = max(host.backed_off_until_ms, until)
        logger.warning(
            "upstream refused a connect: backing the host off for the fleet",
            extra={"host": limit.host, "status": status, "backoff_s": seconds},
        )
        try:
            await self._store.back_off(limit.host, until, f"HTTP {status}")
        except StoreError as error:
            logger.warning("could not write the host's back-off", extra={"error": str(error)})

    async def _pump(self, host: _Host) -> None:
        """Hands tokens to the host's waiters, best priority first, taking from the table as
        needed, until no one waits."""
        fresh = False
        while host.waiters:
            while host.waiters and (send_by := self._use_cached(host)) is not None:
                self._grant(host, send_by)
            if not host.waiters:
                return
            wait_ms = host.backed_off_until_ms - now_ms()
            if wait_ms > 0:
                await self._sleep(host, wait_ms / 1000)
                fresh = True
                continue
            limit = host.limit
            urgent = host.waiters[0].priority == URGENT
            try:
                take = await self._store.take(
                    limit.host,
                    limit.per_take(len(host.waiters)),
                    count=limit.count,
                    seconds=limit.seconds,
                    urgent=urgent,
                    fresh=fresh,
                )
            except StoreError as error:
                logger.warning("connect budget unavailable; retrying", extra={"error": str(error)})
                await self._sleep(host, STORE_RETRY_S)
                continue
            self.write_units += take.write_units
            self.read_units += take.read_units
            if take.tokens:
                # Used within the hold of the reply (a slow write must not waste the tokens), and
                # sent by SEND_BY_MS after the grant's own time: a connect later than that might
                # reach the upstream in a window that no longer counts its grant.
                now = self._clock()
                granted = now - max(0, now_ms() - take.granted_at_ms) / 1000
                token = (now + HOLD_MS / 1000 * 0.8, granted + SEND_BY_MS / 1000)
                host.cached.extend([token] * take.tokens)
                self.granted += take.tokens
                fresh = False
                continue
            await self._sleep(host, max(0.0, (take.retry_at_ms - now_ms()) / 1000) + 0.01)
            fresh = True

    def _grant(self, host: _Host, send_by: float) -> None:
        waiter = heapq.heappop(host.waiters)
        if not waiter.granted.done():
            waiter.granted.set_result(send_by)
        else:  # cancelled while queued: give the token back to the cache
            host.cached.append((min(self._clock() + HOLD_MS / 1000 * 0.8, send_by), send_by))

    async def _sleep(self, host: _Host, seconds: float) -> None:
        """Sleep, but wake early for a more urgent waiter (it may take while cold starts yield)."""
        host.wake.clear()
        best = host.waiters[0].priority if host.waiters else COLD
        deadline = self._clock() + seconds
        while (left := deadline - self._clock()) > 0 and not math.isinf(left):
            try:
                async with asyncio.timeout(left):
                    await host.wake.wait()
            except TimeoutError:
                return
            host.wake.clear()
            if host.waiters and host.waiters[0].priority < best:
                return
            if not host.waiters:
                return

    async def close(self) -> None:
        for host in self._hosts.values():
            if host.pump is not None:
                host.pump.cancel()
        await asyncio.gather(
            *(h.pump for h in self._hosts.values() if h.pump is not None), return_exceptions=True
        )
