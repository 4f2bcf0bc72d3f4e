"""One worker's wall clock runs 5 s ahead (libfaketime, DONT_FAKE_MONOTONIC=1): issue 9.

Setup: 24 connections at 20 msg/s, two healthy workers, then a third whose wall clock is
OFFSET_S ahead, far beyond MAX_CLOCK_SKEW_MS (FAST timings: lease 3 s, skew 200 ms).

- Session mode judges death on each observer's own monotonic clock and holds connections through
  the session item, so the offset changes nothing: once the fair share has spread, no live
  connection moves for a steady window, and nothing stale reaches the sink.
- Connection mode, the same run, is the negative control: the fast worker sees every healthy
  lease as expired (its now − skew is past their expiry) and takes live leases (docs/design.md §2a,
  "known limits"). The victims learn it from whichever write of theirs is refused first: a
  checkpoint, a renewal, or the upstream's stale-epoch error.

Stale deliveries are judged from outside, from the sink: within each worker's file a
connection's epochs never go down, and across files, S1 on the write timestamps of one clock
(the fast worker's timestamps moved back by the offset we gave it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import time
from collections import defaultdict
from pathlib import Path

import pytest

from leaseworker_dev.local.faketime import FaketimeUnavailable, find_libfaketime, offset_env, probe
from leaseworker_dev.local.fleet import FAST, Fleet, poll_until
from leaseworker_dev.local.invariants import Delivered, Report, check_s1, check_s2, check_s3, read_sink
from leaseworker_dev.local.services import local_dynamodb
from tests.system.test_failover import CheckpointSampler, wait_until

OFFSET_S = 5.0
N_CONNECTIONS = 24
HEALTHY = ("w1", "w2")
AHEAD = "wahead"
STABLE_S = 3.0  # leases unchanged this long: the fair share has spread
SETTLE_TIMEOUT_S = 20.0
STEADY_WINDOW_S = 15.0

Leases = dict[str, tuple[str | None, int]]


@pytest.fixture
def ahead_env() -> dict[str, str]:
    library = find_libfaketime()
    if library is None:
        pytest.skip("libfaketime not installed (Debian libfaketime; scripts/install-test-tools.sh)")
    env = offset_env(library, OFFSET_S)
    try:
        probe({**os.environ, **env}, OFFSET_S)
    except FaketimeUnavailable as error:
        pytest.skip(str(error))
    return env


@dataclasses.dataclass
class Outcome:
    settled: bool = False
    moves_in_window: int = 0  # connections whose epoch rose during the steady window
    moved_from_healthy: int = 0  # ... of those, held by a live healthy worker before
    thefts: int = 0  # leases taken by expiry from a live healthy worker (the taker's log)
    losses: int = 0  # leases a live healthy worker found taken from it (its own log)
    stale: int = 0  # S1 violations on one clock, plus epoch regressions within a worker's file
    session_offsets_ms: dict[str, int] = dataclasses.field(default_factory=dict)
    report: Report = dataclasses.field(default_factory=Report)


@pytest.mark.parametrize("mode", ["session", "connection"])
def test_one_worker_clock_ahead(tmp_path: Path, mode: str, ahead_env: dict[str, str]) -> None:
    with Fleet(tmp_path, timings=FAST, feed_rate=20.0, lease_mode=mode) as fleet:
        outcome = run_clock_ahead(fleet, ahead_env)
    print(
        f"\nclock offset +{OFFSET_S:g} s ({mode}): settled={outcome.settled} "
        f"moves_in_window={outcome.moves_in_window} moved_from_healthy={outcome.moved_from_healthy} "
        f"thefts={outcome.thefts} losses={outcome.losses} stale={outcome.stale} "
        f"session_offsets_ms={outcome.session_offsets_ms} "
        f"report={outcome.report.as_dict()}"
    )
    # The offset really is inside the worker: its heartbeats stamp its own wall clock.
    assert abs(outcome.session_offsets_ms[AHEAD] - OFFSET_S * 1000) < 2000, outcome.session_offsets_ms
    assert all(abs(outcome.session_offsets_ms[name]) < 2000 for name in HEALTHY), outcome.session_offsets_ms
    if mode == "session":
        assert outcome.settled, "the fair share never settled"
        assert outcome.moves_in_window == 0, "a live connection moved"
        assert outcome.thefts == 0
        assert outcome.losses == 0
        assert outcome.stale == 0, outcome.report.violations
        assert outcome.report.ok, outcome.report.violations
    else:
        # The negative control: the same run does what docs/design.md §2a says it does.
        assert outcome.thefts > 0, "connection mode: no lease was taken from a live healthy worker"
        assert outcome.losses > 0, "connection mode: the healthy workers never learned of the thefts"


def run_clock_ahead(fleet: Fleet, ahead_env: dict[str, str]) -> Outcome:
    outcome = Outcome()
    ids = [f"conn-{i:02d}" for i in range(N_CONNECTIONS)]
    fleet.add_connections(ids)
    for name in HEALTHY:
        fleet.start_worker(name)
    wait_until(lambda: all_owned(fleet.leases(), set(HEALTHY)), 20, "the healthy workers own everything")
    fleet.start_worker(AHEAD, extra_env=ahead_env)
    everyone = {*HEALTHY, AHEAD}
    sampler = CheckpointSampler(fleet)
    sampler.start()
    try:
        outcome.settled = settle(fleet, everyone)
        outcome.session_offsets_ms = asyncio.run(session_offsets(fleet.endpoint, everyone))
        before = fleet.leases()
        seen_epochs = {cid: epoch for cid, (_, epoch) in before.items()}
        deadline = time.monotonic() + STEADY_WINDOW_S
        while time.monotonic() < deadline:
            time.sleep(0.5)
            for cid, (_, epoch) in fleet.leases().items():
                seen_epochs[cid] = max(seen_epochs[cid], epoch)
        moved = {cid for cid, epoch in seen_epochs.items() if epoch > before[cid][1]}
        outcome.moves_in_window = len(moved)
        outcome.moved_from_healthy = sum(1 for cid in moved if before[cid][0] in HEALTHY)
    finally:
        sampler.halt.set()
        sampler.join()
    for name in everyone:  # graceful stop, so that no sink line is half written when we read
        fleet.signal(name, signal.SIGTERM)
    for name in everyone:
        assert fleet.wait_exit(name, 15) == 0, f"{name} did not exit cleanly"
    logs = {name: log_records(fleet.logs / f"{name}.log") for name in everyone}
    outcome.thefts = sum(
        1
        for records in logs.values()
        for record in records
        if record.get("message") == "lease acquired"
        and record.get("how") == "takeover by expiry"
        and record.get("previous_owner") in HEALTHY
    )
    outcome.losses = sum(
        1 for name in HEALTHY for record in logs[name] if record.get("message") == "lease lost"
    )
    records = read_sink(fleet.sink_dir)
    outcome.stale = regressions_within_files(records)
    check_s1(on_one_clock(records, {AHEAD: int(OFFSET_S * 1000)}), outcome.report)
    outcome.stale += len(outcome.report.violations)
    check_s2(records, outcome.report)
    check_s3(sampler.samples, records, outcome.report)
    return outcome


def log_records(path: Path) -> list[dict[str, object]]:
    """A worker's JSON log lines (Powertools Logger); anything else on the stream is skipped."""
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def all_owned(leases: Leases, owners: set[str]) -> bool:
    return len(leases) == N_CONNECTIONS and all(owner in owners for owner, _ in leases.values())


def settle(fleet: Fleet, everyone: set[str]) -> bool:
    """Wait until every worker holds about its share and no lease changed for STABLE_S."""
    last: Leases = {}
    since = time.monotonic()
    lowest = N_CONNECTIONS // len(everyone) - 1

    def stable() -> bool:
        nonlocal last, since
        leases = fleet.leases()
        if leases != last:
            last, since = leases, time.monotonic()
            return False
        owners = [owner for owner, _ in leases.values()]
        spread = all(owners.count(name) >= lowest for name in everyone)
        return all_owned(leases, everyone) and spread and time.monotonic() - since >= STABLE_S

    return poll_until(stable, SETTLE_TIMEOUT_S, interval=0.25)


async def session_offsets(endpoint: str, names: set[str]) -> dict[str, int]:
    """Each worker's last heartbeat stamp minus our clock: its wall-clock offset, less up to one
    heartbeat period of age."""
    offsets: dict[str, int] = {}
    async with local_dynamodb(endpoint) as client:
        for name in sorted(names):
            item = await client.get_item(
                TableName="leaseworker-connections",
                Key={"connection_id": {"S": f"worker#{name}"}},
                ConsistentRead=True,
            )
            stamped = int(item["Item"]["updated_at_ms"]["N"])
            offsets[name] = stamped - time.time_ns() // 1_000_000
    return offsets


def regressions_within_files(records: dict[str, list[Delivered]]) -> int:
    """Records whose epoch is lower than an earlier record of the same connection from the same
    worker. `read_sink` keeps each file's order, and each worker appends to its own file in its
    order of delivery."""
    count = 0
    for items in records.values():
        highest: dict[str, int] = defaultdict(lambda: -1)
        for item in items:
            if item.epoch < highest[item.worker_id]:
                count += 1
            highest[item.worker_id] = max(highest[item.worker_id], item.epoch)
    return count


def on_one_clock(
    records: dict[str, list[Delivered]], offsets_ms: dict[str, int]
) -> dict[str, list[Delivered]]:
    """The records with each worker's known clock offset taken out of `received_at_ms`."""
    return {
        cid: [
            dataclasses.replace(item, received_at_ms=item.received_at_ms - offsets_ms.get(item.worker_id, 0))
            for item in items
        ]
        for cid, items in records.items()
    }
