"""The session heartbeat (DESIGN.md §2.0), in both lease modes.

Every HEARTBEAT_SECONDS the worker increments `hb` on its session item `worker#<id>`, publishing
its load and capacity, conditioned on not being fenced. A success moves the session's local
deadline to (send time + LEASE_SECONDS − margin); in session mode that deadline is every
held lease's deadline (§2d). A refusal means a peer or the supervisor fenced us: the worker
drops everything at once (`on_fenced`) and stops.

Each attempt is bounded by 1.5 heartbeats and, in session mode, by the session's remaining
validity (a heartbeat that lands later could extend nothing we may rely on). After a pause the
schedule restarts from now instead of firing a burst.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from leaseworker.lease.errors import StoreError
from leaseworker.lease.liveness import SessionValidity
from leaseworker.lease.session_store import Fenced, SessionStore
from leaseworker.observability.logging import get_logger
from leaseworker.observability.tracing import Tracing
from leaseworker.settings import Settings
from leaseworker.worker.loops import survive
from leaseworker.worker.registry import Registry
from leaseworker.worker.waits import wait_any

logger = get_logger(__name__)

ATTEMPT_HEARTBEATS = 1.5


class SessionHeartbeat:
    def __init__(
        self,
        *,
        sessions: SessionStore,
        registry: Registry,
        validity: SessionValidity,
        settings: Settings,
        tracing: Tracing,
        on_fenced: Callable[[Fenced], None],
        on_beat: Callable[[], None] | None = None,
        task_arn: str | None = None,
    ) -> None:
        self._sessions = sessions
        self._registry = registry
        self._validity = validity
        self._settings = settings
        self._tracing = tracing
        self._on_fenced = on_fenced
        self._on_beat = on_beat
        self._task_arn = task_arn
        self.withdrawing = False  # set at shutdown: capacity 0, peers stop counting us
        self.beats = 0

    async def run(self, done: asyncio.Event) -> None:
        period = self._settings.heartbeat_seconds
        next_at = time.monotonic() + period
        while not done.is_set() and not self._validity.fenced:
            await wait_any(max(0.0, next_at - time.monotonic()), done)
            if done.is_set():
                return
            next_at = max(next_at + period, time.monotonic())
            with survive("heartbeat"):
                await self.beat()

    async def beat(self) -> bool:
        """One heartbeat; True when it succeeded."""
        settings = self._settings
        sent_at = time.monotonic()
        timeout = ATTEMPT_HEARTBEATS * settings.heartbeat_seconds
        if settings.lease_mode == "session" and self.beats:
            timeout = min(timeout, self._validity.valid_until - sent_at)
            if timeout <= 0:
                timeout = ATTEMPT_HEARTBEATS * settings.heartbeat_seconds  # lapsed: try to recover
        try:
            with self._tracing.span("session.heartbeat", load=len(self._registry)):
                result = await self._sessions.heartbeat(
                    settings.worker_id,
                    load=len(self._registry),
                    capacity=settings.max_connections,
                    lease_mode=settings.lease_mode,
                    task_arn=self._task_arn,
                    timeout=timeout,
                )
        except StoreError as error:
            logger.warning("session heartbeat failed", extra={"error": str(error)})
            return False
        if isinstance(result, Fenced):
            logger.error(
                "our session is fenced: stopping at once",
                extra={"fenced_by": result.fenced_by, "kind": result.kind, "reason": result.reason},
            )
            self._validity.fence()
            self._on_fenced(result)
            return False
        self.beats += 1
        self._validity.heartbeat_succeeded(sent_at)
        if settings.lease_mode == "session":
            for owned in self._registry.live():
                owned.lease.extend_to(self._validity.valid_until)
        if self._on_beat is not None:
            self._on_beat()
        return True
