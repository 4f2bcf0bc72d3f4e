"""Anti-entropy: every AUDIT_EVERY_HEARTBEATS heartbeats, a worker audits what it holds.

A connection item held by a session never expires, so any path that loses track of one (a lost
claim reply, a release that never landed, a bug) strands it: held by a live worker that does
not serve it, for that worker's lifetime. Each specific path is fixed at its cause; this is the
net under them. The audit reads what the table says we hold (the `by-owner` index, KEYS_ONLY,
eventually consistent) and compares it with the registry:
- held by us, not served (not owned, not being claimed): after a consistent read confirms it,
  adopt it (a session from its effective checkpoint: max of the item's `last_seq` and our own
  checkpoint entry at its epoch), or release it with that checkpoint when it cannot be served
  (STOPPED, no room, our session not valid; connection mode always releases);
- served, but no longer ours (the consistent read shows another owner or epoch): stop at once.
The index lags, so nothing is repaired on its word alone; candidates are re-read consistently,
and the registry checked again after the read. Leases in transition (being claimed, ending,
settling) are left to the paths that own them.

Every repair counts in `LeasesRepaired`: it is a bug in our code or a lost DynamoDB reply, and
an operator should look (the stack alarms on it).

Cost: one Query of our own partition of `by-owner` per period, 0.5 read unit per 4 KB of index
entries (about 50 bytes each: 80 per 4 KB), plus one consistent GetItem (1 read unit) per
candidate, which is zero in the steady state. See docs/reliability.md.
"""

from __future__ import annotations

import asyncio

from leaseworker.lease.checkpoint_store import resume_seq
from leaseworker.lease.connection_store import ConnectionStore
from leaseworker.lease.errors import StoreError
from leaseworker.lease.held_store import SessionHeldStore
from leaseworker.lease.model import ConnectionItem, Lease, LeaseState, MalformedItem
from leaseworker.lease.ownership import Ownership
from leaseworker.lease.results import AcquireResult, Lost
from leaseworker.lease.session_leases import SessionLeases
from leaseworker.observability.logging import get_logger
from leaseworker.observability.metrics import MetricName, WorkerMetrics
from leaseworker.settings import Settings
from leaseworker.worker.acquirer import Acquirer
from leaseworker.worker.loops import survive
from leaseworker.worker.registry import Owned, Registry
from leaseworker.worker.waits import wait_any

logger = get_logger(__name__)

AUDIT_EVERY_HEARTBEATS = 6  # 30 s at the default HEARTBEAT_SECONDS of 5


class Audit:
    def __init__(
        self,
        *,
        held: SessionHeldStore,
        leases: ConnectionStore,
        ownership: Ownership,
        registry: Registry,
        acquirer: Acquirer,
        settings: Settings,
        metrics: WorkerMetrics,
        stop_acquiring: asyncio.Event,
    ) -> None:
        self._held = held
        self._leases = leases
        self._ownership = ownership
        self._registry = registry
        self._acquirer = acquirer
        self._settings = settings
        self._metrics = metrics
        self._stop = stop_acquiring
        self._me = settings.worker_id

    @property
    def period(self) -> float:
        return AUDIT_EVERY_HEARTBEATS * self._settings.heartbeat_seconds

    async def run(self) -> None:
        while not self._stop.is_set():
            await wait_any(self.period, self._stop)
            if self._stop.is_set():
                return
            with survive("audit"):
                await self.round()

    async def round(self) -> int:
        """One audit; the number of repairs."""
        try:
            listed = set(await self._held.owner_ids(self._me))
        except StoreError as error:
            logger.warning("audit: could not list what we hold", extra={"error": str(error)})
            return 0
        owned = self._registry.owned
        unserved = sorted(cid for cid in listed if not self._registry.busy(cid))
        unheld = sorted(cid for cid, entry in owned.items() if cid not in listed and _steady(entry))
        repaired = 0
        entries: dict[str, tuple[int, int]] | None = None
        for cid in unserved:
            item = await self._read(cid)
            if item is None or item.lease_owner != self._me or self._registry.busy(cid):
                continue  # the index lagged, or a claim of ours began meanwhile
            if entries is None:
                entries = await self._own_entries()
            repaired += 1
            self._repaired("held by us but not served", cid, item.lease_epoch)
            await self._adopt_or_release(item, resume_seq(entries, cid, item.lease_epoch))
        for cid in unheld:
            served = owned.get(cid)
            if served is None or not _steady(served):
                continue
            item = await self._read(cid)
            ours = (
                item is not None and item.lease_owner == self._me and item.lease_epoch == served.lease.epoch
            )
            if ours or owned.get(cid) is not served or not _steady(served):
                continue
            repaired += 1
            self._repaired("served but no longer ours", cid, served.lease.epoch)
            served.session.lose("audit: the table no longer names us at this epoch")
        return repaired

    async def _adopt_or_release(self, item: ConnectionItem, entry: int) -> None:
        async def adopt() -> AcquireResult:
            adopted = await self._ownership.adopt(item, entry_seq=entry)
            return adopted or Lost(None, None, "released by the audit")

        result = await self._acquirer.claim(item.connection_id, attempt=adopt, over_share=True)
        if result is not None or self._registry.busy(item.connection_id):
            return
        # Not attempted: no room at all, or shutting down. Release it, with its checkpoint.
        lease = Lease(item.connection_id, item.lease_epoch, self._me, item.ws_url, item.last_seq, 0.0)
        try:
            await self._ownership.release(lease, max(item.last_seq, entry))
        except StoreError as error:
            extra = {"connection_id": item.connection_id, "error": str(error)}
            logger.warning("audit: could not release; the next audit retries", extra=extra)

    def _repaired(self, what: str, cid: str, epoch: int) -> None:
        self._metrics.count(MetricName.LeasesRepaired)
        logger.error(f"audit repair: {what}", extra={"connection_id": cid, "epoch": epoch})

    async def _read(self, cid: str) -> ConnectionItem | None:
        try:
            return await self._leases.get(cid)  # consistent
        except (StoreError, MalformedItem) as error:
            logger.warning("audit: could not read an item", extra={"connection_id": cid, "error": str(error)})
            return None

    async def _own_entries(self) -> dict[str, tuple[int, int]]:
        if not isinstance(self._ownership, SessionLeases):
            return {}  # connection mode checkpoints into the item itself
        try:
            return await self._ownership.own_entries()
        except StoreError as error:
            logger.warning("audit: could not read our checkpoints", extra={"error": str(error)})
            return {}


def _steady(owned: Owned) -> bool:
    """Held and not ending: a lease in transition belongs to the path that moves it."""
    return owned.lease.state is LeaseState.HELD and not owned.settling
