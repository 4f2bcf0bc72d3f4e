"""How a connection's session ends in the table: released, marked failed, or lost (docs/design.md §3).

A lost lease is normally someone else's already (taken over, or our session fenced). One case
is not: in session mode a connection item is held by our session item, not by an expiring
lease, so when our local deadline passed (a pause, a partition) while our session was never
fenced, or an upstream refused our epoch (`stale_epoch`), the item still names us and nobody will
ever take it over. Such a lapsed lease is handed
back like a graceful release, with what the sink accepted, as soon as DynamoDB answers; the
checkpointer keeps its entry in our checkpoint item until then (`Registry.lapsed`). The write is
conditioned on our owner and epoch, so it cannot touch a takeover, and it delivers nothing.
Found by the seeded fault suite (a SIGSTOP shorter than a peer's suspicion: L1 and S3).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from leaseworker.clock import monotonic
from leaseworker.lease.errors import StoreError
from leaseworker.lease.ownership import Ownership
from leaseworker.lease.results import Acquired
from leaseworker.notify import Notifier
from leaseworker.observability.logging import get_logger
from leaseworker.observability.metrics import MetricName
from leaseworker.worker.endings import Outcome, SessionResult
from leaseworker.worker.session import ConnectionSession
from leaseworker.worker.session_deps import SessionDeps

logger = get_logger(__name__)

RELEASE_RETRY_DELAYS = (0.2, 0.5, 1.0)  # the first waits between attempts of a release ...
RELEASE_RETRY_CAP_SECONDS = 2.0  # ... then this, until it lands (review 2026-12-05, B)
LAPSED_RETRY_SECONDS = 0.5  # a lapsed session-held lease: retried until handed back or fenced


class Settler:
    def __init__(
        self,
        ownership: Ownership,
        deps: SessionDeps,
        notifier: Notifier,
        *,
        fenced: Callable[[], bool],
        leaving: Callable[[], bool],
        publish_load: Callable[[], Awaitable[None]],
    ) -> None:
        self._ownership = ownership
        self._metrics = deps.metrics
        self._tracing = deps.tracing
        self._notifier = notifier
        self._fenced = fenced
        self._leaving = leaving  # shutting down: our releases are handoffs (notify.py)
        self._publish_load = publish_load  # heartbeat.py: our load without this one, first

    async def settle(self, session: ConnectionSession, result: SessionResult) -> None:
        lease = session.lease
        if result.outcome is Outcome.LOST:
            self._metrics.count(MetricName.LeasesLost)
            logger.warning(
                "lease lost", extra={"reason": result.reason, "delivered_seq": session.delivered_seq}
            )
            if self._ownership.hands_back(lease):
                await self._hand_back_lapsed(session, result.reason)
            return
        if result.outcome is Outcome.RELEASE and not self._leaving():
            # A rebalance or an operator's stop: peers must not see it free while our published
            # load still counts it (leaving, we are already withdrawn from their views).
            await self._publish_load()
        if not await self._until_landed(session, result):
            return
        handoff = result.outcome is not Outcome.FAILED and self._leaving()
        await self._notifier.connection_changed(lease.connection_id, handoff=handoff)

    async def _until_landed(self, session: ConnectionSession, result: SessionResult) -> bool:
        """Release or mark failed, retried until it lands (True). The registry entry, and with it
        the lease's checkpoint entry (session mode), stays until then. Given up (False) only
        when it no longer matters: our session is fenced (peers take over from our checkpoint
        item), or, in connection mode, the lease's local deadline passed (it expires). A
        session-held item never expires, so "left to expire" stranded it (review 2026-12-05, B).
        """
        lease = session.lease
        delays = iter(RELEASE_RETRY_DELAYS)
        while True:
            try:
                if result.outcome is Outcome.FAILED:
                    await self._ownership.mark_failed(
                        lease, result.reason, session.delivered_seq, session.delivered_cursor
                    )
                    logger.error("connection marked failed", extra={"reason": result.reason})
                else:
                    await self._release(session, result.reason)
                return True
            except StoreError as error:
                if self._fenced():
                    logger.error("could not release; our session is fenced", extra={"error": str(error)})
                    return False
                if self._ownership.left_to_expire(lease, monotonic()):
                    logger.error("could not release; the lease will expire", extra={"error": str(error)})
                    return False
                delay = next(delays, RELEASE_RETRY_CAP_SECONDS)
                logger.warning("release failed; retrying", extra={"error": str(error), "delay_s": delay})
                await asyncio.sleep(delay)

    async def give_back(self, acquired: Acquired) -> None:
        """A claim that landed after shutdown began: release it at once, with a hint. Logged: the
        connection had an owner that never served it, until this release."""
        lease = acquired.lease
        logger.warning(
            "a claim landed after shutdown began; handing it back",
            extra={"connection_id": lease.connection_id, "epoch": lease.epoch},
        )
        with contextlib.suppress(StoreError):
            await self._ownership.release(lease, None)
            await self._notifier.connection_changed(lease.connection_id, handoff=True)

    async def _release(self, session: ConnectionSession, reason: str) -> bool:
        lease = session.lease
        with self._tracing.span("lease.release", connection_id=lease.connection_id):
            released = await self._ownership.release(lease, session.delivered_seq, session.delivered_cursor)
        extra = {"released": released, "last_seq": session.delivered_seq, "reason": reason}
        logger.info("lease released", extra=extra)
        return released

    async def _hand_back_lapsed(self, session: ConnectionSession, why: str) -> None:
        """Until it lands, or our session turns out fenced (then peers take it over from our
        checkpoint item): if it was taken over meanwhile, the condition refuses it."""
        while not self._fenced():
            try:
                if await self._release(session, f"{why}; handing it back"):
                    await self._notifier.connection_changed(session.lease.connection_id, handoff=True)
                return
            except StoreError as error:
                logger.warning("could not hand back a lapsed lease yet", extra={"error": str(error)})
            await asyncio.sleep(LAPSED_RETRY_SECONDS)
