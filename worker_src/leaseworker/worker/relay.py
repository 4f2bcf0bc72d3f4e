"""Passing a `connection_changed` hint on to a peer with room (docs/design.md §6), boundedly.

One shared queue hands each message to one consumer. A worker that learns of a claimable
connection it has no room for (a hint landed on it while full, or a dead peer's connection it
would take over but cannot) re-sends the hint, so that a peer with room hears of it now instead
of at its next listing or reconcile. Each worker passes a given connection on at most
PASS_ON_LIMIT times per PASS_ON_WINDOW_SECONDS, so a fleet with no room at all stops bouncing it
(reconcile and the peer listing remain the backstop).

A hint this worker must not act on at all (it is leaving, or the hint announces its own release)
is `forward`ed without that bound: it says nothing about room, and the bound, spent on the same
connection's plain hints moments before, dropped it (the fault suite: a connection shed by
rebalance bounced between full workers, was claimed, and its owner's SIGTERM release hint, read
by its own last poll, was dropped there; the handoff waited 1.6 s for a reconcile, against L2's
1.5 s). It cannot loop: a leaving worker reads one last batch, and a release is "our own" only
while its entry settles.
"""

from __future__ import annotations

from leaseworker.clock import monotonic
from leaseworker.notify import Notifier
from leaseworker.observability.logging import get_logger

logger = get_logger(__name__)

PASS_ON_LIMIT = 3  # re-sends of one hint by one worker per window
PASS_ON_WINDOW_SECONDS = 10.0
PASS_ON_MEMORY = 10_000  # connection ids remembered for that bound


class HintRelay:
    def __init__(self, notifier: Notifier) -> None:
        self._notifier = notifier
        self._passed_on: dict[str, list[float]] = {}

    async def pass_on(self, connection_id: str, *, handoff: bool = False) -> bool:
        """Re-send the hint (a handoff stays one) unless this worker has passed it on too often
        lately; True if sent."""
        now = monotonic()
        recent = [t for t in self._passed_on.get(connection_id, []) if now - t < PASS_ON_WINDOW_SECONDS]
        if len(recent) >= PASS_ON_LIMIT:
            self._passed_on[connection_id] = recent
            logger.debug("hint not passed on: bound reached", connection_id=connection_id, handoff=handoff)
            return False
        self._passed_on[connection_id] = [*recent, now]
        if len(self._passed_on) > PASS_ON_MEMORY:
            self._passed_on = {
                k: v for k, v in self._passed_on.items() if now - v[-1] < PASS_ON_WINDOW_SECONDS
            }
        await self._notifier.connection_changed(connection_id, handoff=handoff)
        return True

    async def forward(self, connection_id: str, *, handoff: bool = False) -> None:
        """Re-send a hint this worker must not act on (above), without the bound."""
        await self._notifier.connection_changed(connection_id, handoff=handoff)
