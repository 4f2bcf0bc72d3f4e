"""Passing a `connection_changed` hint on to a peer with room (docs/design.md §6), boundedly.

One shared queue hands each message to one consumer. A worker that learns of a claimable
connection it has no room for (a hint landed on it while full, or a dead peer's connection it
would take over but cannot) re-sends the hint, so that a peer with room hears of it now instead
of at its next listing or reconcile. Each worker passes a given connection on at most
PASS_ON_LIMIT times per PASS_ON_WINDOW_SECONDS, so a fleet with no room at all stops bouncing it
(reconcile and the peer listing remain the backstop).
"""

from __future__ import annotations

from leaseworker.clock import monotonic
from leaseworker.notify import Notifier

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
            return False
        self._passed_on[connection_id] = [*recent, now]
        if len(self._passed_on) > PASS_ON_MEMORY:
            self._passed_on = {
                k: v for k, v in self._passed_on.items() if now - v[-1] < PASS_ON_WINDOW_SECONDS
            }
        await self._notifier.connection_changed(connection_id, handoff=handoff)
        return True
