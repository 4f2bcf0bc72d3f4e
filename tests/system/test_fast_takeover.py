"""docs/design.md §2e: the supervisor sees the worker process die and peers take over at once.

At production timings (lease 20 s, heartbeat 5 s), in both lease modes: SIGKILL of the worker
child (an OOM-like death) is followed within about a second, plus connect time, by every one of
its connections being subscribed elsewhere, far inside the lease. At scaled timings: SIGSTOP of
the child alone past the lease is no death, so its supervisor fences nothing; the lease (an
observer's suspicion, or the expiry) takes over, and the woken child delivers nothing. Judged
from outside: the feed's session log and the records in the order one Kinesis shard got them.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from leaseworker.worker.fenced import EXIT_FENCED
from leaseworker_dev.local.fleet import FAST, Fleet, Timings
from leaseworker_dev.local.invariants import check_arrivals
from tests.system.test_failover import (
    CONNECT_ALLOWANCE_S,
    stale_after_takeover,
    wait_for_subscribes,
    wait_until,
)

PRODUCTION = Timings(shutdown_grace_seconds=10.0)  # lease 20 s, heartbeat 5 s, reconcile 5 s
N = 12
# The supervisor's fence and hints (about 0.3–1 s: it imports its SDK lazily), the hint's trip
# through SQS, the peer's sweep of the dead session, the rendezvous order (up to two steps).
FENCE_PATH_S = 1.5
SIGKILL_STATUS = 128 + signal.SIGKILL


@pytest.fixture(params=["connection", "session"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def start(fleet: Fleet, names: list[str]) -> set[str]:
    fleet.add_connections([f"c-{i:02d}" for i in range(N)])
    for name in names:
        fleet.start_worker(name)
    alive = set(names)
    wait_until(lambda: all_owned_n(fleet, alive) and balanced_n(fleet, alive), 90, "all owned, spread out")
    return alive


def all_owned_n(fleet: Fleet, alive: set[str]) -> bool:
    owners = fleet.leases()
    return len(owners) == N and all(owner in alive for owner, _ in owners.values())


def balanced_n(fleet: Fleet, alive: set[str]) -> bool:
    owners = [owner for owner, _ in fleet.leases().values()]
    return all(owners.count(name) >= N // len(alive) // 2 for name in alive)


def test_child_killed_is_taken_over_at_once(tmp_path: Path, mode: str) -> None:
    with Fleet(tmp_path, timings=PRODUCTION, feed_rate=5.0, lease_mode=mode, kinesis_stream="r") as fleet:
        alive = start(fleet, ["w1", "w2", "w3"])
        time.sleep(2.0)
        before = fleet.leases()
        victims = {cid for cid, (owner, _) in before.items() if owner == "w1"}
        killed_ms = int(fleet.signal_child("w1", signal.SIGKILL) * 1000)
        alive.discard("w1")
        taken = wait_for_subscribes(fleet, victims, killed_ms, before)
        assert fleet.wait_exit("w1", 10) == SIGKILL_STATUS  # the supervisor exits with the child's status
        session = fleet.session("w1")
        assert session is not None and session["fence_kind"] == "confirmed", session
        worst = max(taken.values())
        print(
            f"\nfast takeover ({mode}): {len(taken)} connections, max {worst:.2f} s, {sorted(taken.values())}"
        )
        assert worst <= FENCE_PATH_S + CONNECT_ALLOWANCE_S, taken
        assert worst < PRODUCTION.lease_seconds / 4
        wait_until(lambda: all_owned_n(fleet, alive), 10, "all owned")
        time.sleep(2.0)
        report = check_arrivals(fleet.arrivals())
    assert report.ok, report.violations


def test_child_paused_past_the_lease_is_not_fenced_by_its_supervisor(tmp_path: Path, mode: str) -> None:
    with Fleet(tmp_path, timings=FAST, feed_rate=5.0, lease_mode=mode, kinesis_stream="r") as fleet:
        alive = start(fleet, ["w1", "w2", "w3"])
        time.sleep(1.0)
        before = fleet.leases()
        paused = {cid for cid, (owner, _) in before.items() if owner == "w2"}
        held = {(cid, epoch) for cid, (owner, epoch) in before.items() if owner == "w2"}
        stopped_ms = int(fleet.signal_child("w2", signal.SIGSTOP) * 1000)
        alive.discard("w2")
        wait_for_subscribes(fleet, paused, stopped_ms, before)
        # In connection mode the expired leases can move before a peer's observation (L on its
        # own clock, judged at its listings) fences the session: wait for that fence.
        wait_until(lambda: bool((fleet.session("w2") or {}).get("fenced_by")), 15, "w2's session fenced")
        session = fleet.session("w2")
        assert session is not None and not str(session.get("fenced_by", "")).startswith("supervisor:"), (
            session
        )
        assert fleet.workers["w2"].process.alive(), "a paused child is not a dead one"
        fleet.signal_child("w2", signal.SIGCONT)
        status = fleet.wait_exit("w2", 15)
        assert status == EXIT_FENCED, (status, (fleet.logs / "w2.log").read_text().splitlines()[-6:])
        arrivals = fleet.arrivals()
    assert not stale_after_takeover(arrivals, held)
    report = check_arrivals(arrivals)
    assert report.ok, report.violations
