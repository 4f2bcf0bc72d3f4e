"""The SQS fast path (docs/design.md §6): act on `connection_changed` hints at once.

A hint for a connection we do not own is a chance to claim it (added, started, released
elsewhere); one we have no room for is passed on (`relay`). A hint for a connection we own makes us
re-read it: stopped → close and release; taken over or removed → drop it; malformed → mark it
failed. The loop is contained like the others: no error in one hint ends it.

Hints are handled concurrently, up to HINTS_IN_FLIGHT at once: a leaving peer's release sends one
hint per connection, and each takes a few round trips (share, claim). Handled one after another,
the fifteenth waited for the fourteen before it (seen: 1.0 s from a release to its hint being
read, and a 1.8 s handoff against L2's "about one second"). A hint for a connection whose hint is
still being handled runs again after it, so no change it announces is missed.

A handoff hint (a leaving worker's release, notify.py) is claimed even above our fair share, up
to MAX_CONNECTIONS: every survivor may count itself full while the published loads lag the
claims, and the connection needs an owner now. Rebalancing hands any excess back gracefully.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from leaseworker.clock import monotonic
from leaseworker.lease.errors import StoreError
from leaseworker.lease.model import STARTED, MalformedItem
from leaseworker.lease.ownership import Ownership
from leaseworker.lease.results import Lost
from leaseworker.notify import Hint
from leaseworker.observability.logging import get_logger
from leaseworker.worker.acquirer import Acquirer
from leaseworker.worker.loops import survive
from leaseworker.worker.registry import Registry
from leaseworker.worker.relay import HintRelay
from leaseworker.worker.waits import wait_any

logger = get_logger(__name__)

RESTART_DELAY_SECONDS = 1.0  # after the hint source itself failed
HINTS_IN_FLIGHT = 16  # as many as the acquirer claims at once

HintSource = Callable[[asyncio.Event], AsyncIterator[Hint]]


class Hints:
    def __init__(
        self,
        *,
        ownership: Ownership,
        registry: Registry,
        acquirer: Acquirer,
        relay: HintRelay,
        stop_acquiring: asyncio.Event,
        holder_check: Callable[[str, str], Awaitable[bool]] | None = None,
        refresh_peers: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self._refresh_peers = refresh_peers
        self._holder_check = holder_check
        self._ownership = ownership
        self._registry = registry
        self._acquirer = acquirer
        self._relay = relay
        self._stop = stop_acquiring
        self._slots = asyncio.Semaphore(HINTS_IN_FLIGHT)
        self._in_flight: set[str] = set()
        self._again: dict[str, Hint] = {}  # hinted again while in flight

    async def run(self, source: HintSource) -> None:
        while not self._stop.is_set():
            with survive("notifications"):
                async with asyncio.TaskGroup() as group:
                    async for hint in source(self._stop):
                        if hint.connection_id in self._in_flight:
                            again = self._again.get(hint.connection_id)
                            if again is None or not again.handoff:
                                self._again[hint.connection_id] = hint
                            continue
                        await self._slots.acquire()
                        self._in_flight.add(hint.connection_id)
                        group.create_task(self._handle(hint))
            # A handler cancelled before it ran never freed its slot: start afresh.
            self._slots = asyncio.Semaphore(HINTS_IN_FLIGHT)
            self._in_flight.clear()
            self._again.clear()
            await wait_any(RESTART_DELAY_SECONDS, self._stop)

    async def _handle(self, hint: Hint) -> None:
        connection_id = hint.connection_id
        try:
            while True:
                with survive("notification"):
                    await self.on_changed(hint)
                again = self._again.pop(connection_id, None)
                if again is None:
                    return
                hint = again
        finally:
            self._in_flight.discard(connection_id)
            self._slots.release()

    async def on_changed(self, hint: Hint) -> None:
        connection_id = hint.connection_id
        owned = self._registry.owned.get(connection_id)
        if owned is None:
            if self._stop.is_set():
                await self._relay.forward(connection_id, handoff=hint.handoff)
                return
            if hint.handoff and self._acquirer.capacity(over_share=True) > 0:
                await self._acquirer.claim(connection_id, over_share=True)
                return
            if not await self._acquirer.has_room() and not await self._room_after_listing():
                # Full by a fresh listing too, which may still count a peer the supervisor has
                # just fenced (its hints are how we hear of the death first): if the holder is
                # fenced, our share has grown and its connections are being taken over; else the
                # hint goes on to a peer that may have room.
                if not await self._holder_fenced(connection_id):
                    await self._relay.pass_on(connection_id, handoff=hint.handoff)
                return
            result = await self._acquirer.claim(connection_id)
            if isinstance(result, Lost) and result.holder and self._holder_check is not None:
                # Held: by a live peer, or by one just fenced: look at the holder's session.
                await self._holder_check(result.holder, connection_id)
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
        if item is not None and not item.lease_owner and owned.settling:
            # Our own release's hint, read (by a peer's poll or our own last one) before the send
            # returned and the entry left the registry: pass it on. Dropped here, the connection
            # waited for a reconcile (seen: 7 of 120 handoffs at 0.8-2.8 s, bench/handoff_trace.py).
            await self._relay.forward(connection_id, handoff=hint.handoff)
            return
        if item is None or item.lease_epoch != session.lease.epoch or item.lease_owner != session.lease.owner:
            session.lose("connection removed or taken over")
        elif item.desired_state != STARTED:
            session.request_release("desired_state STOPPED")

    async def _holder_fenced(self, connection_id: str) -> bool:
        if self._holder_check is None:
            return False
        try:
            item = await self._ownership.status(connection_id)
        except (StoreError, MalformedItem):
            return False
        if item is None or not item.lease_owner:
            return False
        return await self._holder_check(item.lease_owner, connection_id)

    async def _room_after_listing(self) -> bool:
        """Our share from a listing made now: after a handoff, the last one still counts the
        leaving worker and its load (seen as 2-3 s handoff tails, docs/design.md §2c L2)."""
        listed_at = monotonic()
        if self._refresh_peers is None or not await self._refresh_peers():
            return False
        await self._acquirer.refresh_share_since(listed_at)
        return self._acquirer.capacity() > 0
