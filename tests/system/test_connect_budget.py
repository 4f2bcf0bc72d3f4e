"""A takeover storm within an upstream's connect limit (issue 24; docs/design.md §4.2, docs/tuning.md).

A local Jetstream replay accepts at most COUNT connects in any SECONDS (then 429, and a 418 ban:
feed/replays/limits.py). N `generic/1` connections to it, each with `budget: {count: COUNT,
seconds: SECONDS}`, cold-started by two workers (paced by the budget; N and COUNT per mode, see
STORMS). Once the fleet is balanced and still, w1's worker child (about N/2 connections, two
windows' worth) is SIGKILLed; w2 takes them over (the
supervisor's fence and hints) and reconnects them, paced. Judged from outside: the replay's count
of connects never exceeds COUNT in any window of SECONDS and it refused nothing; every lost
connection delivers again within the fence path's bound plus the budget's term (docs/tuning.md
§6); S1, seq contiguity per epoch, and no loss (Jetstream replays from its cursor: every event
between a connection's first and last delivered reaches the sink). In both lease modes.

The negative control runs the same fleet without budgets (the limit is switched on just before
the kill, so that the cold start is not the storm): the takeover meets 429s.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.budget_store import paced_seconds
from leaseworker.protocol.presets import expand
from leaseworker_dev.feed.replays.limits import ConnectLimit, peak_in_window
from leaseworker_dev.local.fleet import FAST
from tests.system.feeds_fleet import Arrival, FeedsFleet, check_s1, check_seqs, wait_until
from tests.system.test_failover import CONNECT_ALLOWANCE_S
from tests.system.test_fast_takeover import FENCE_PATH_S

SECONDS = 2.0
RATE = 1.0  # Jetstream events per second (every connection gets them all)
SIGKILL_STATUS = 128 + signal.SIGKILL
WINDOW_S = paced_seconds(2, 1, SECONDS)  # how long a grant counts


@dataclass(frozen=True, slots=True)
class Storm:
    connections: int  # N, over two workers: the victim holds about half
    count: int  # COUNT: the victim's half is two windows' worth


STORMS = {
    "session": Storm(connections=400, count=100),
    # Half the session run's: at N = 400, connection mode (300 writes/s, below) kept both cores
    # 90-100 % busy (DynamoDB Local 70-100 %, the workers 30-70 %), and every step of the fence
    # path ran two to three times slower than on an idle host (the confirmed fence 0.6-0.8 s,
    # the first claim 1.9 s, the claims 1.7 s for 200): the takeover met the bound (6.6 s) 0 of
    # 4 times here, at 7.3-10.3 s. The test is about pacing by the budget, which N = 200,
    # COUNT = 50 tests the same way (two windows), at half the load.
    "connection": Storm(connections=200, count=50),
}


# Connection mode writes per connection: a renewal each heartbeat and a checkpoint each checkpoint
# period. At FAST (1 s, 1 s) that was 800 writes/s for N = 400, above DynamoDB Local's ceiling
# (about 600/s here, less on a loaded machine): renewals queued behind each other, a worker
# self-fenced in the cold start and the takeover's claims waited in the same queue. The test is
# about connect budgets, not about that ceiling, so connection mode runs at twice FAST's periods
# and three quarters of the checkpoint rate: 0.75 writes/s per connection, 300/s for N = 400 (and
# 150/s for the N = 200 it now runs).
CONNECTION_MODE_TIMINGS = replace(FAST, lease_seconds=6.0, heartbeat_seconds=2.0, checkpoint_seconds=4.0)


def bound_s(lost: int, count: int) -> float:
    """The fence path's L1 plus the budget's term for `lost` connections (docs/tuning.md §6)."""
    return FENCE_PATH_S + CONNECT_ALLOWANCE_S + paced_seconds(lost, count, SECONDS)


@pytest.fixture
def fleet(
    tmp_path: Path, dynamodb_endpoint: str, moto_endpoint: str, marker: str, request: pytest.FixtureRequest
) -> Iterator[FeedsFleet]:
    params = request.node.callspec.params
    count = STORMS[params["mode"]].count
    limit = ConnectLimit(count, SECONDS, ban_after=20, ban_seconds=10.0, armed=params["budgeted"])
    timings = CONNECTION_MODE_TIMINGS if params["mode"] == "connection" else FAST
    running = FeedsFleet(tmp_path, dynamodb_endpoint, moto_endpoint, marker, params["mode"], timings)
    try:
        running.start({"jetstream": {"rate": RATE, "host_limit": limit}})
        yield running
    finally:
        running.close()


def add_connections(fleet: FeedsFleet, url: str, budgeted: bool, storm: Storm) -> list[str]:
    config = expand("jetstream", {"url": url})
    if budgeted:
        config["budget"] = {"count": storm.count, "seconds": SECONDS}
    else:
        config.pop("budget", None)
    text = json.dumps(config)
    ids = [f"js-{i:03d}" for i in range(storm.connections)]

    async def add_all(admin: LeaseTableAdmin) -> None:
        for cid in ids:
            await admin.add(cid, str(config["connect"]["url"]), protocol="generic/1", protocol_config=text)

    fleet.admin.call(add_all)
    return ids


def firsts(arrivals: list[Arrival], above: dict[str, int]) -> dict[str, int]:
    """Each connection's first record (received_at_ms) of an epoch above `above[cid]`."""
    found: dict[str, int] = {}
    for a in arrivals:
        if a.epoch > above.get(a.cid, 1 << 62):
            ms = int(a.record["received_at_ms"])
            found[a.cid] = min(found.get(a.cid, ms), ms)
    return found


def check_no_loss(arrivals: list[Arrival], rate: float) -> list[str]:
    """Jetstream replays: between a connection's first and last delivered event, every event of
    the replay's tape (one each 1/rate s, time_us apart by 1e6/rate) reached the sink."""
    step = int(1_000_000 // rate)
    cursors: dict[str, set[int]] = defaultdict(set)
    for a in arrivals:
        if a.record["kind"] == "data":
            cursors[a.cid].add(int(a.record["cursor"]))
    violations = []
    for cid, seen in sorted(cursors.items()):
        expected = set(range(min(seen), max(seen) + 1, step))
        lost = sorted(expected - seen)
        if lost:
            violations.append(
                f"S2 {cid}: {len(lost)} events between its first and last never arrived: {lost[:3]}"
            )
    return violations


@pytest.mark.parametrize(
    ("mode", "budgeted"),
    [
        pytest.param("session", True, id="session-budget"),
        pytest.param("connection", True, id="connection-budget"),
        pytest.param("session", False, id="session-no-budget"),
    ],
)
def test_takeover_storm_stays_within_the_upstream_limit(fleet: FeedsFleet, mode: str, budgeted: bool) -> None:
    replays = fleet.replays
    assert replays is not None
    server = replays.servers["jetstream"]
    limit = server.host_limit
    assert limit is not None
    storm = STORMS[mode]
    N, COUNT = storm.connections, storm.count
    ids = add_connections(fleet, server.url, budgeted, storm)
    started = time.monotonic()
    w1 = fleet.start_worker("w1")
    w2 = fleet.start_worker("w2")
    wait_until(
        lambda: len(firsts(fleet.tailer.arrivals(), {cid: 0 for cid in ids})) == N,
        30 + paced_seconds(N, COUNT, SECONDS),
        "the fleet delivering every connection",
    )
    cold_start_s = time.monotonic() - started

    def settled() -> bool:  # both hold a share, and nothing moved for two seconds
        first = fleet.leases()
        time.sleep(2.0)
        return first == fleet.leases() and {o for o, _ in first.values()} == {"w1", "w2"}

    wait_until(settled, 40, "the fleet balanced and still")
    time.sleep(WINDOW_S)  # every grant of the cold start and the balancing has lapsed
    before = fleet.leases()
    epochs = {cid: epoch for cid, (owner, epoch) in before.items() if owner == "w1"}
    lost = len(epochs)
    assert lost > COUNT, f"w1 holds {lost}: too few to need pacing"
    if not budgeted:
        limit.armed = True  # the storm to come is the takeover's

    fault_ms = time.time_ns() // 1_000_000
    os.kill(w1.child(), signal.SIGKILL)
    assert fleet.wait_exit("w1", 15) == SIGKILL_STATUS, w1.tail()
    if not budgeted:
        wait_until(
            lambda: any(e.code == 429 for e in replays.ledger("jetstream") if e.kind == "refused"),
            20,
            "the takeover's storm to meet a 429",
        )
        return

    wait_until(
        lambda: len(firsts(fleet.tailer.arrivals(), epochs)) == lost,
        bound_s(lost, COUNT) + 15,
        "every connection back",
    )
    taken = {cid: (ms - fault_ms) / 1000 for cid, ms in firsts(fleet.tailer.arrivals(), epochs).items()}
    time.sleep(2.0)
    os.kill(w2.popen.pid, signal.SIGTERM)
    assert fleet.wait_exit("w2", 20) == 0, w2.tail()
    arrivals = fleet.tailer.stop()
    replays.stop()
    ledger = replays.ledger("jetstream")
    fleet.save_ledger("jetstream", ledger)

    opens = [e.t_ms for e in ledger if e.kind == "open"]
    refused = [e.code for e in ledger if e.kind == "refused"]
    peak = peak_in_window(opens, SECONDS)
    slowest = max(taken.values())
    summary: dict[str, Any] = {
        "connects": len(opens),
        "lost": lost,
        "peak_per_window": peak,
        "budget": f"{COUNT}/{SECONDS:g}s",
        "cold_start_s": round(cold_start_s, 1),
        "takeover_s": {
            "first": round(min(taken.values()), 2),
            "median": round(sorted(taken.values())[lost // 2], 2),
            "max": round(slowest, 2),
            "bound": round(bound_s(lost, COUNT), 2),
        },
        "records": len(arrivals),
    }
    print(f"\nconnect budget {mode}: {summary}")
    assert refused == [], f"the upstream refused connects: {refused[:10]}"
    assert peak <= COUNT, summary
    assert slowest <= bound_s(lost, COUNT), summary
    violations = [*check_s1(arrivals), *check_seqs(arrivals), *check_no_loss(arrivals, RATE)]
    assert not violations, violations[:10]
    # The storm was paced, not merely lucky: the takeover needed more than one window.
    assert slowest >= paced_seconds(lost, COUNT, SECONDS), summary
