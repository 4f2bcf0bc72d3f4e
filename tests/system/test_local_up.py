"""`leaseworker local up --scenario failover --json`, run as a user would, judged on its JSON.

The command starts its own DynamoDB Local, moto, feed and workers; kills, pauses and terminates
workers; prints one JSON summary on stdout and exits 0 only if docs/design.md §2c held. Afterwards no
process it started may be left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.system.procscan import MARKER_VAR, alive, processes_with_marker

LEASEWORKER = Path(sys.executable).with_name("leaseworker")


def test_failover_scenario_json(tmp_path: Path, marker: str) -> None:
    env = {**os.environ, MARKER_VAR: marker}
    done = subprocess.run(
        [
            str(LEASEWORKER),
            "local",
            "up",
            "--scenario",
            "failover",
            "--duration",
            "3",
            "--json",
            "--connections",
            "12",
            "--workers",
            "3",
            "--root",
            str(tmp_path / "fleet"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)  # stdout is pure JSON: progress goes to stderr
    assert "local up:" in done.stderr

    by_name = {result["scenario"]: result for result in summary["scenarios"]}
    assert list(by_name) == ["crash", "kill", "pause", "graceful"]
    for result in summary["scenarios"]:
        assert result["connections"] > 0, result
        assert set(result["times_s"]) and not result["unmeasured"], result
        assert result["max_s"] == max(result["times_s"].values())
        assert result["ok"], result
    # Session mode is the default: lease + two heartbeats + two rendezvous steps + connect.
    from leaseworker.worker.takeover_bound import takeover_bound_s
    from leaseworker_dev.local.fleet import FAST

    assert summary["settings"]["lease_seconds"] == FAST.lease_seconds
    bound = takeover_bound_s("session", FAST, 1.5)
    assert by_name["kill"]["bound_s"] == bound
    assert by_name["kill"]["max_s"] <= bound
    # The child's death is seen by its supervisor: fence, hints, claim, connect (docs/design.md §2e).
    assert by_name["crash"]["bound_s"] == 1.5 + 1.5
    assert by_name["crash"]["max_s"] <= by_name["crash"]["bound_s"]
    assert by_name["pause"]["max_s"] <= bound
    assert by_name["pause"]["stale_after_wake"] == 0
    assert by_name["graceful"]["max_s"] <= 1.5
    assert by_name["graceful"]["exit_code"] == 0

    assert summary["ok"] is True
    assert set(summary["invariants"]) == {"S1", "S2", "S3", "L1", "L2"}
    for name, check in summary["invariants"].items():
        assert check["ok"] and not check["violations"], (name, check)
    totals = summary["totals"]
    assert totals["connections"] == 12
    assert totals["missing"] == 0
    assert totals["delivered"] > 12 * 20  # 20 msg/s per connection for well over a second

    # Nothing left behind: neither the recorded pids nor anything that inherited our marker.
    assert len(summary["pids"]) >= 3 + 3 + 4  # services, workers, replacements
    assert [pid for pid in summary["pids"] if alive(pid)] == []
    assert processes_with_marker(marker) == []


def test_local_up_plain_mixed_fleet(tmp_path: Path, marker: str) -> None:
    """`local up` without a terminal (plain lines) runs the mixed fleet: the seqfeed/1 connections
    and the two generic/1 ones on the Jetstream and Coinbase replays, all delivered to the sink;
    the replays are children like the rest, stopped with the fleet."""
    env = {**os.environ, MARKER_VAR: marker}
    root = tmp_path / "fleet"
    done = subprocess.run(
        [
            *(str(LEASEWORKER), "local", "up", "--no-auto-faults", "--duration", "12"),
            *("--connections", "3", "--workers", "2", "--root", str(root)),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all 5 connections owned" in done.stdout, done.stdout
    assert "jetstream-1 = generic/1 [jetstream]" in done.stdout
    assert "coinbase-1 = generic/1 [coinbase-exchange]" in done.stdout
    assert "gap         coinbase-1 connect (nothing delivered before; next trade" in done.stdout
    kinds: dict[str, dict[str, int]] = {}
    for path in (root / "sink").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            counts = kinds.setdefault(record["connection_id"], {})
            counts[record["kind"]] = counts.get(record["kind"], 0) + 1
    assert set(kinds) == {"feed-00", "feed-01", "feed-02", "jetstream-1", "coinbase-1"}, kinds
    assert kinds["jetstream-1"].get("data", 0) > 10 and "gap" not in kinds["jetstream-1"], kinds
    assert kinds["coinbase-1"].get("data", 0) > 10 and kinds["coinbase-1"].get("gap", 0) >= 1, kinds
    # The replays logged each subscription with its connection, epoch and worker (the clock for
    # generic/1 takeover times).
    for feed, cid in (("jetstream", "jetstream-1"), ("coinbase-exchange", "coinbase-1")):
        lines = [json.loads(x) for x in (root / f"replay-{feed}-sessions.jsonl").read_text().splitlines()]
        assert any(e["event"] == "subscribe" and e["connection_id"] == cid and e["epoch"] >= 1 for e in lines)
    assert processes_with_marker(marker) == []
