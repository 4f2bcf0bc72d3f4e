"""The P5 and P6 benchmarks cannot rot: their tiny modes run on a real local fleet and produce
results of the right shape, a report and plots. Nothing here times anything."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import cold_start, process_capacity
from bench.capacity_plots import cold_start_plot, rss_plot
from leaseworker.lease.vocabulary import MAX_ENTRIES_PER_ITEM
from leaseworker_dev.feed.server import data_for, data_frame


@pytest.mark.system
def test_process_capacity_tiny_holds_every_connection_and_delivers(tmp_path: Path) -> None:
    results = process_capacity.run("tiny")
    json.dumps(results, allow_nan=False)  # JSON-able, strictly
    assert set(results["sinks"]) == set(process_capacity.SINKS)
    for ramp in results["sinks"].values():
        assert [s["connections"] for s in ramp["steps"]] == list(process_capacity.TINY.steps)
        assert ramp["dense"]["connections"] == process_capacity.TINY.dense_connections
        assert ramp["baseline_rss_bytes"] > 0 and ramp["supervisor_rss_bytes"] > 0
        for step in [*ramp["steps"], ramp["dense"]]:
            assert step["all_subscribed"]
            assert step["held_feed"] == step["connections"]
            assert step["msgs_per_s_wall"] > 0 and step["rss_bytes"] > 0
            # CPU time is counted in clock ticks (10 ms): a tiny step's worker may use less than one
            # in its window (on uvloop, 25 msg/s for 2.5 s did), and then reads 0 cores and 0 msgs/s
            # per core. The dense step (500 msg/s) always uses several.
            assert step["msgs_per_cpu_s"] > 0 or step["cores"]["worker"] == 0
        assert ramp["dense"]["msgs_per_cpu_s"] > 0 and ramp["dense"]["cores"]["worker"] > 0
    lines = process_capacity.section(results)
    assert lines[0].startswith("## P5") and any("msgs/s per core" in line for line in lines)
    rss_plot(results, tmp_path / "rss.png")
    assert (tmp_path / "rss.png").stat().st_size > 0


@pytest.mark.system
def test_cold_start_tiny_owns_and_subscribes_every_connection(tmp_path: Path) -> None:
    results = cold_start.run("tiny")
    json.dumps(results, allow_nan=False)
    assert [(r["lease_mode"], r["workers"]) for r in results["rows"]] == [("connection", 3), ("session", 3)]
    for row in results["rows"]:
        assert row["all_subscribed"] and row["subscribed"] == row["expected_owned"] == row["connections"]
        assert row["owned_at_end"] == row["open_at_end"] == row["connections"]
        assert row["claims_per_s"] > 0 and len(row["curve"]) == 101
    lines = cold_start.section(results)
    assert lines[0].startswith("## P6")
    cold_start_plot(results, tmp_path / "cold.png")
    assert (tmp_path / "cold.png").stat().st_size > 0


def test_session_mode_rows_cover_the_checkpoint_item_cap() -> None:
    """Beyond 3 × MAX_ENTRIES_PER_ITEM, a row with enough session-mode workers for all is added."""
    full = cold_start.CONFIGS["full"]
    assert full.connections > 3 * MAX_ENTRIES_PER_ITEM
    assert [(r.lease_mode, r.workers) for r in full.rows] == [
        ("connection", 3),
        ("session", 3),
        ("session", math.ceil(full.connections / MAX_ENTRIES_PER_ITEM)),  # 9 for 10,000
    ]


@pytest.mark.parametrize("connection_id", ["a", "p5-00001", "x.y_z:1-2"])
@pytest.mark.parametrize("seq", [0, 7, 10**15])
def test_the_feeds_formatted_data_frame_is_the_json_of_its_data(connection_id: str, seq: int) -> None:
    expected = {"type": "data", "seq": seq, "data": data_for(connection_id, seq)}
    assert data_frame(connection_id, seq) == json.dumps(expected, separators=(",", ":"))
