"""Partition one worker from DynamoDB while its upstream sockets stay up.

The worker keeps running and keeps receiving frames, but its renewals vanish into a blackhole.
It must self-fence at its local deadline, before the lease can expire for anyone else, and
deliver nothing under the old epochs once a peer has taken over. Checked from the sink files.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from leaseworker.worker.fenced import EXIT_FENCED
from leaseworker_dev.local.fleet import FAST, Fleet
from leaseworker_dev.local.invariants import check_all, read_sink
from leaseworker_dev.local.proxy import ProxyThread
from tests.system.test_failover import wait_until

N = 10
EVEN_SPLIT = ["cut"] * (N // 2) + ["peer"] * (N // 2)


@pytest.fixture(params=["connection", "session"])
def fleet(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    with Fleet(tmp_path, timings=FAST, feed_rate=20.0, lease_mode=request.param) as running:
        yield running


def test_partitioned_worker_self_fences_before_takeover(fleet: Fleet) -> None:
    assert fleet.dynamodb is not None
    with ProxyThread("127.0.0.1", fleet.dynamodb.port) as proxy:
        fleet.add_connections([f"p-{i}" for i in range(N)])
        fleet.start_worker("cut", extra_env={"AWS_ENDPOINT_URL_DYNAMODB": proxy.url})
        fleet.start_worker("peer")
        wait_until(
            lambda: sorted(str(o) for o, _ in fleet.leases().values()) == EVEN_SPLIT,
            30,
            "an even split",
        )
        time.sleep(2.0)
        before = fleet.leases()
        held = {cid: epoch for cid, (owner, epoch) in before.items() if owner == "cut"}

        proxy.set_mode("blackhole")
        cut_at_ms = int(time.time() * 1000)
        wait_until(lambda: all(fleet.leases()[cid][0] == "peer" for cid in held), 20, "the peer to take over")
        time.sleep(2.0)
        assert fleet.workers["cut"].process.alive(), "a partition is not a crash: the worker stays up"

        records = read_sink(fleet.sink_dir)
        for cid, epoch in held.items():
            old = [r for r in records[cid] if r.epoch == epoch]
            new = [r for r in records[cid] if r.epoch > epoch]
            assert old and new, cid
            last_old = max(r.received_at_ms for r in old)
            first_new = min(r.received_at_ms for r in new)
            # Self-fenced within the local validity of its last renewal (<= one lease after the cut)...
            assert last_old <= cut_at_ms + FAST.lease_seconds * 1000, (cid, last_old - cut_at_ms)
            # ...and strictly before the new owner delivered anything.
            assert last_old < first_new, (cid, first_new - last_old)
        log = (fleet.logs / "cut.log").read_text()
        assert "self-fenced" in log

        # Healed: its peer fenced its silent session meanwhile, so its first heartbeat tells it
        # to stop (docs/design.md §2.0); it exits 3, and a fresh worker in its place gets a share.
        proxy.set_mode("pass")
        assert fleet.wait_exit("cut", 15) == EXIT_FENCED
        fleet.start_worker("fresh")
        wait_until(lambda: "fresh" in {o for o, _ in fleet.leases().values()}, 30, "the new worker to own")
    report, _ = check_all(fleet.sink_dir)
    assert report.ok, report.violations
