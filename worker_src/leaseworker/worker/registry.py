"""What this worker owns right now: one entry per leased connection, plus claims in flight.

Every loop of the worker (renewals, checkpoints, reconcile, hints, shutdown) reads this one
registry, so "owned" has a single meaning. An entry exists from the moment a claim succeeded
until its session task has settled (released, marked failed or lost).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from leaseworker.clock import monotonic
from leaseworker.lease.model import HAND_BACK_REASONS, Lease, LeaseState
from leaseworker.worker.session import ConnectionSession


@dataclass(slots=True)
class Owned:
    session: ConnectionSession
    task: asyncio.Task[None] | None = None
    acquired_at: float = field(default_factory=monotonic)
    next_renewal: float = 0.0  # monotonic; connection mode renews each lease on its own schedule
    renewing: int = 0  # connection-mode renewals of this lease in flight (pipelined)
    settling: bool = False  # the session ended; its release or failure mark is being written

    @property
    def lease(self) -> Lease:
        return self.session.lease


class Registry:
    def __init__(self) -> None:
        self.owned: dict[str, Owned] = {}
        self.claiming: set[str] = set()
        self.changed = asyncio.Event()  # set whenever an entry is added: the keeper re-plans

    def add(self, owned: Owned) -> None:
        self.owned[owned.lease.connection_id] = owned
        self.changed.set()

    def remove(self, connection_id: str) -> None:
        self.owned.pop(connection_id, None)

    def busy(self, connection_id: str) -> bool:
        """Owned, or a claim for it is in flight: never claim it again."""
        return connection_id in self.owned or connection_id in self.claiming

    def held(self) -> list[Owned]:
        """Leases we mean to keep (not handing back)."""
        return [o for o in self.owned.values() if o.lease.state is LeaseState.HELD]

    def live(self) -> list[Owned]:
        """Leases still ours, including those being handed back: both keep being renewed."""
        return [o for o in self.owned.values() if o.lease.state in (LeaseState.HELD, LeaseState.RELEASING)]

    def lapsed(self) -> list[Owned]:
        """Leases lost to us while their item may still name us (our own deadline, an upstream's
        stale_epoch), not yet settled: session mode hands them back (worker/settle.py)."""
        return [
            o
            for o in self.owned.values()
            if o.lease.state is LeaseState.LOST and o.lease.end_reason in HAND_BACK_REASONS
        ]

    def __len__(self) -> int:
        return len(self.owned)
