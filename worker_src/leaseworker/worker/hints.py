"""The SQS fast path (DESIGN.md §6): act on `connection_changed` hints at once.

A hint for a connection we do not own is a chance to claim it (added, started, released
elsewhere); one we cannot use is passed on, boundedly. A hint for a connection we own makes us
re-read it: stopped → close and release; taken over or removed → drop it; malformed → mark it
failed. The loop is contained like the others: no error in one hint ends it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from leaseworker.lease.errors import StoreError
from leaseworker.lease.model import STARTED, MalformedItem
from leaseworker.lease.ownership import Ownership
from leaseworker.lease.store import Lost
from leaseworker.notify import Notifier
from leaseworker.observability.logging import get_logger
from leaseworker.worker.acquirer import Acquirer
from leaseworker.worker.loops import survive
from leaseworker.worker.registry import Registry
from leaseworker.worker.waits import wait_any

logger = get_logger(__name__)

PASS_ON_LIMIT = 3  # re-sends of one hint by one worker per window
PASS_ON_WINDOW_SECONDS = 10.0
PASS_ON_MEMORY = 10_000  # connection ids remembered for that bound
SHARE_REFRESH_SECONDS = 0.25  # at most this often outside reconcile, when a hint finds us full
RESTART_DELAY_SECONDS = 1.0  # after the hint source itself failed

HintSource = Callable[[asyncio.Event], AsyncIterator[str]]


class Hints:
    def __init__(
        self,
        *,
        ownership: Ownership,
        registry: Registry,
        acquirer: Acquirer,
        notifier: Notifier,
        stop_acquiring: asyncio.Event,
        holder_check: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self._holder_check = holder_check
        self._ownership = ownership
        self._registry = registry
        self._acquirer = acquirer
        self._notifier = notifier
        self._stop = stop_acquiring
        self._passed_on: dict[str, list[float]] = {}

    async def run(self, source: HintSource) -> None:
        while not self._stop.is_set():
            with survive("notifications"):
                async for connection_id in source(self._stop):
                    with survive("notification"):
                        await self.on_changed(connection_id)
            await wait_any(RESTART_DELAY_SECONDS, self._stop)

    async def on_changed(self, connection_id: str) -> None:
        owned = self._registry.owned.get(connection_id)
        if owned is None:
            if self._stop.is_set():
                await self.pass_on(connection_id)
                return
            acquirer = self._acquirer
            if acquirer.capacity() <= 0 and time.monotonic() - acquirer.viewed_at > SHARE_REFRESH_SECONDS:
                await acquirer.refresh_share()  # a peer may just have left: our share may have grown
            if acquirer.capacity() <= 0:
                await self.pass_on(connection_id)
                return
            result = await acquirer.claim(connection_id)
            if isinstance(result, Lost) and result.holder and self._holder_check is not None:
                # Held: by a live peer, or by one the supervisor just saw die (its hints are
                # how we hear of it before our next listing): look at the holder's session.
                await self._holder_check(result.holder)
            return
        session = owned.session
        try:
            item = await self._ownership.status(connection_id)
        except StoreError:
            return  # the next renewal will find out
        except MalformedItem as problem:
            logger.error(
                "owned connection item is malformed; marking it failed", extra={"error": str(problem)}
            )
            try:
                await self._ownership.mark_failed(session.lease, str(problem))
            except StoreError as error:
                logger.warning("could not mark failed", extra={"error": str(error)})
            session.lose(f"malformed item: {problem}")
            return
        if item is None or item.lease_epoch != session.lease.epoch or item.lease_owner != session.lease.owner:
            session.lose("connection removed or taken over")
        elif item.desired_state != STARTED:
            session.request_release("desired_state STOPPED")

    async def pass_on(self, connection_id: str) -> None:
        """Re-send a hint we cannot act on, so that a peer with room gets it.

        One shared queue hands each message to one consumer; without this, a hint that lands on
        a full worker waits for some peer's reconcile. Each worker passes a given connection on
        at most PASS_ON_LIMIT times per PASS_ON_WINDOW_SECONDS, so a fleet with no room at all
        stops bouncing it (reconcile remains the backstop).
        """
        now = time.monotonic()
        recent = [t for t in self._passed_on.get(connection_id, []) if now - t < PASS_ON_WINDOW_SECONDS]
        if len(recent) >= PASS_ON_LIMIT:
            self._passed_on[connection_id] = recent
            return
        self._passed_on[connection_id] = [*recent, now]
        if len(self._passed_on) > PASS_ON_MEMORY:
            self._passed_on = {
                k: v for k, v in self._passed_on.items() if now - v[-1] < PASS_ON_WINDOW_SECONDS
            }
        await self._notifier.connection_changed(connection_id)
