"""A hint for our own release, read before its entry left the registry, goes on to a peer.

A released connection's hint can be read (by a peer, or by the leaving worker's own last long
poll) before the send returns, while the settling session is still registered. It used to be
taken for a takeover ("connection removed or taken over") and dropped: the connection then
waited for a reconcile (bench/handoff_trace.py: 7 of 120 handoffs at 0.8-2.8 s). Real worker
parts, DynamoDB Local; the relay records what it passes on instead of sending it.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import replace

from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.results import Acquired
from leaseworker.notify import Hint, Notifier
from leaseworker.settings import Settings
from leaseworker.worker.main import build_worker
from leaseworker.worker.registry import Owned
from leaseworker.worker.relay import HintRelay
from leaseworker.worker.session import ConnectionSession


class RecordingRelay(HintRelay):
    def __init__(self) -> None:
        super().__init__(Notifier(None, None))
        self.passed: list[tuple[str, bool]] = []

    async def pass_on(self, connection_id: str, *, handoff: bool = False) -> bool:
        self.passed.append((connection_id, handoff))
        return True


async def test_a_hint_for_our_settled_release_is_passed_on(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    tuned = replace(settings, lease_mode="session", lease_seconds=20.0, heartbeat_seconds=5.0, sink="null")
    await LeaseTableAdmin(ddb, table).add("mine", "ws://127.0.0.1:1/feeds/mine")
    async with AsyncExitStack() as stack:
        worker, _ = await build_worker(tuned, stack)
        await worker._heartbeat.beat()  # our session is valid: claims may be made
        claimed = await worker._ownership.claim("mine")
        assert isinstance(claimed, Acquired)
        session = ConnectionSession(claimed.lease, worker._deps, worker._ownership.record_failure)
        owned = Owned(session)
        worker._registry.add(owned)
        relay = RecordingRelay()
        worker._hints._relay = relay

        # A hint for a connection we still serve, unchanged in the table: nothing to pass on.
        await worker._hints.on_changed(Hint("mine"))
        assert relay.passed == [] and not session.stop_requested.is_set()

        # The session ended and its release landed; the entry is still registered (settling).
        session.request_release("worker shutting down")
        owned.settling = True
        assert await worker._ownership.release(session.lease, -1)
        worker._stop_acquiring.set()  # leaving, as in a shutdown
        await worker._hints.on_changed(Hint("mine", handoff=True))
    assert relay.passed == [("mine", True)]
