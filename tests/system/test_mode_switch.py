"""A rolling LEASE_MODE switch, and crashes in a mixed fleet (docs/design.md §2b "Mixed fleets").

Mode is how a worker holds its own connections; every worker, in either mode, takes over both
kinds (expired leases; the connections of fenced sessions). So replacing connection-mode workers
one by one by session-mode workers, and back, must deliver once, lose nothing and leave nothing
stuck; and when a worker of either mode dies, a worker of the other mode takes its connections.

24 connections at 20 msg/s, file sink, FAST timings (lease 3 s, heartbeat 1 s, skew 200 ms).
S1–S3 are checked from outside on the sink files and on checkpoint samples.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from leaseworker_dev.local.fleet import FAST, Fleet
from leaseworker_dev.local.invariants import check_all
from tests.system.test_failover import CheckpointSampler, wait_until

N_CONNECTIONS = 24
SESSION_HELD_MS = 2**53 - 1  # docs/design.md §2b: a connection held by a session
CONNECTION, SESSION = "connection", "session"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path, timings=FAST, feed_rate=20.0) as running:
        running.add_connections([f"conn-{i:02d}" for i in range(N_CONNECTIONS)])
        yield running


def start(fleet: Fleet, name: str, mode: str, alive: dict[str, str]) -> None:
    fleet.start_worker(name, extra_env={"LEASE_MODE": mode})
    alive[name] = mode


def owned_by(items: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    by_owner: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        by_owner.setdefault(str(item.get("lease_owner")), []).append(item)
    return by_owner


def all_owned(fleet: Fleet, alive: dict[str, str]) -> bool:
    items = fleet.list_connections()
    return len(items) == N_CONNECTIONS and all(item.get("lease_owner") in alive for item in items)


def spread(fleet: Fleet, alive: dict[str, str]) -> bool:
    """All owned by live workers, each holding at least half its fair share."""
    items = fleet.list_connections()
    by_owner = owned_by(items)
    least = N_CONNECTIONS // len(alive) // 2
    return all_owned(fleet, alive) and all(len(by_owner.get(name, [])) >= least for name in alive)


def assert_held_as(fleet: Fleet, alive: dict[str, str]) -> None:
    """Each worker holds its connections its own way: a session marker or a lease expiry."""
    for owner, items in owned_by(fleet.list_connections()).items():
        session_held = [int(item["lease_expires_at_ms"]) == SESSION_HELD_MS for item in items]
        expected = alive[owner] == SESSION
        assert all(held == expected for held in session_held), f"{owner} ({alive[owner]}) holds {items}"


def replace(fleet: Fleet, old: str, new: str, mode: str, alive: dict[str, str]) -> None:
    """Start `new` in `mode`, let it take its share, then SIGTERM `old`: exit 0, nothing orphaned."""
    start(fleet, new, mode, alive)
    wait_until(lambda: spread(fleet, alive), 20, f"{new} ({mode}) takes its share")
    fleet.signal(old, signal.SIGTERM)
    del alive[old]
    assert fleet.wait_exit(old, 15) == 0, f"{old} did not exit cleanly"
    wait_until(lambda: all_owned(fleet, alive), 10, f"{old}'s connections owned again")


def test_rolling_mode_switch(fleet: Fleet) -> None:
    alive: dict[str, str] = {}
    for name in ("c1", "c2", "c3"):
        start(fleet, name, CONNECTION, alive)
    wait_until(lambda: spread(fleet, alive), 20, "the connection-mode fleet owns everything")
    sampler = CheckpointSampler(fleet)
    sampler.start()
    mixed_seen = 0
    try:
        for old, new in (("c1", "s1"), ("c2", "s2"), ("c3", "s3")):
            replace(fleet, old, new, SESSION, alive)
            assert_held_as(fleet, alive)
            mixed_seen += len(set(alive.values())) == 2
        for old, new in (("s1", "c4"), ("s2", "c5"), ("s3", "c6")):
            replace(fleet, old, new, CONNECTION, alive)
            assert_held_as(fleet, alive)
            mixed_seen += len(set(alive.values())) == 2
        wait_until(lambda: spread(fleet, alive), 20, "the connection-mode fleet owns everything again")
    finally:
        sampler.halt.set()
        sampler.join()
    assert mixed_seen == 4  # the fleet really was mixed in between
    for name in list(alive):
        fleet.signal(name, signal.SIGTERM)
    for name in list(alive):
        assert fleet.wait_exit(name, 15) == 0, f"{name} did not exit cleanly"
    report, _ = check_all(fleet.sink_dir, sampler.samples)
    print(f"\nrolling mode switch: {report.as_dict()}")
    assert report.ok, report.violations
    assert report.connections == N_CONNECTIONS


def test_mixed_fleet_crash(fleet: Fleet) -> None:
    alive: dict[str, str] = {}
    for name, mode in (("s1", SESSION), ("c1", CONNECTION), ("c2", CONNECTION)):
        start(fleet, name, mode, alive)
    wait_until(lambda: spread(fleet, alive), 20, "the mixed fleet owns everything")
    sampler = CheckpointSampler(fleet)
    sampler.start()
    try:
        # A session-mode worker dies: the connection-mode workers fence its session (its hb
        # stands still on their clocks) and claim its session-held connections by owner + epoch.
        before = {str(item["connection_id"]): item for item in fleet.list_connections()}
        victims = {cid for cid, item in before.items() if item.get("lease_owner") == "s1"}
        assert victims, "s1 owned nothing"
        fleet.signal("s1", signal.SIGKILL)
        del alive["s1"]
        wait_until(lambda: all_owned(fleet, alive), 20, "c1/c2 take over s1's session-held connections")
        assert_taken_over(fleet, victims, before, {"c1", "c2"})
        assert_held_as(fleet, alive)

        # A connection-mode fleet dies: its leases expire, and session-mode workers claim them.
        for name in ("s2", "s3"):
            start(fleet, name, SESSION, alive)
        wait_until(lambda: spread(fleet, alive), 20, "s2 and s3 take their share")
        before = {str(item["connection_id"]): item for item in fleet.list_connections()}
        victims = {cid for cid, item in before.items() if item.get("lease_owner") in ("c1", "c2")}
        assert victims, "c1 and c2 owned nothing"
        for name in ("c1", "c2"):
            fleet.signal(name, signal.SIGKILL)
            del alive[name]
        wait_until(lambda: all_owned(fleet, alive), 20, "s2/s3 claim the expired leases")
        assert_taken_over(fleet, victims, before, {"s2", "s3"})
        assert_held_as(fleet, alive)
    finally:
        sampler.halt.set()
        sampler.join()
    for name in list(alive):
        fleet.signal(name, signal.SIGTERM)
    for name in list(alive):
        assert fleet.wait_exit(name, 15) == 0, f"{name} did not exit cleanly"
    report, _ = check_all(fleet.sink_dir, sampler.samples)
    print(f"\nmixed-fleet crash: {report.as_dict()}")
    assert report.ok, report.violations
    assert report.connections == N_CONNECTIONS


def assert_taken_over(
    fleet: Fleet, victims: set[str], before: dict[str, dict[str, Any]], takers: set[str]
) -> None:
    now = {str(item["connection_id"]): item for item in fleet.list_connections()}
    for cid in victims:
        assert now[cid].get("lease_owner") in takers, f"{cid} is held by {now[cid].get('lease_owner')}"
        assert int(now[cid]["lease_epoch"]) > int(before[cid]["lease_epoch"]), f"{cid}: epoch did not rise"
