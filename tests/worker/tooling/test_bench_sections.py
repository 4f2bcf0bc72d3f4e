"""The issue 25 sections of docs/benchmarks.md render this run's figures beside the previous run's, and
their verdicts follow the numbers. Synthetic results only: nothing here runs a fleet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import delivery_report, handoff_report, host_loss, p6_report, previous
from bench.report import write_report

DOCS = Path(__file__).resolve().parents[3] / "docs" / "bench"


def _p2_run(label: str, top: float, *, unread: int = 0) -> dict[str, Any]:
    return {
        "label": label,
        "code": "this run (abc1234)",
        "final": True,
        "p2_ms": [100.0 + i for i in range(59)] + [top],
        "invariants_ok": True,
        "derived": {
            "release_to_hint_read_p50": 31.0,
            "release_to_hint_read_p99": 77.0,
            "claim_write_p50": 12.0,
            "claim_write_p99": 55.0,
            "hints_unread": unread,
        },
    }


def _p2(top: float, label: str = "01:00") -> dict[str, Any]:
    config = {"connections": 80, "workers": 4, "rounds": 3, "rate": 5.0}
    return {"date": "2026-12-08T01:00:00+00:00", "config": config, "runs": [_p2_run(label, top)]}


def test_p2_section_shows_this_run_beside_the_previous_one_and_judges_p99() -> None:
    before = {"date": "2026-12-05", "value": _p2(299.0, "13:39")}
    lines = handoff_report.section(_p2(201.0), before)
    text = "\n".join(lines)
    assert "| 01:00 | this run (abc1234) | 60 | 129 | 201 | 201 | 31 / 77 | 12 / 55 | 0 |" in lines
    assert "| previous run (2026-12-05 13:39) | this run (abc1234) | 60 | 129 | 299 | 299 |" in text
    assert "(issue 25, 2026-12-08)" in lines[0]
    assert "**met**: p99 201 ms (0.80x the goal)" in text
    assert "previous run (2026-12-05): **missed**: p99 299 ms (1.20x the goal)" in text
    assert "**missed**: p99 260 ms (1.04x the goal)" in "\n".join(handoff_report.section(_p2(260.0), None))


def test_p2_derive_takes_per_connection_differences_and_counts_unread_hints() -> None:
    steps = {
        "a": {"released": 80, "hint_read": 120, "claim_sent": 130, "acquired": 170},
        "b": {"released": 90, "claim_sent": 900, "acquired": 950},
    }
    derived = handoff_report.derive(steps)
    assert derived["release_to_hint_read_p50"] == 40.0
    assert derived["claim_write_p99"] == 50.0
    assert derived["hints_unread"] == 1


def _loss_row(lease: float, heartbeat: float, p99: float, dollars: float) -> dict[str, Any]:
    loss = {"n": 60, "missed": 0, "p50": p99 - 1, "p99": p99, "max": p99}
    return {
        "setting": f"lease {lease:g}",
        "lease_s": lease,
        "heartbeat_s": heartbeat,
        "host_loss": loss,
        "dollars_per_month_2000_on_4": dollars,
        "invariants_ok": True,
    }


def test_host_loss_section_judges_each_setting_against_both_goals() -> None:
    now = {"date": "2026-12-08", "rows": [_loss_row(20, 5, 20.44, 13.88), _loss_row(6, 2, 6.97, 16.87)]}
    was = {"date": "2026-12-06", "value": {"rows": [_loss_row(6, 2, 7.5, 16.0)]}}
    lines = host_loss.section(now, was)
    text = "\n".join(lines)
    assert "| 6 / 2 | 60 | 5.97 | 6.97 | 6.97 | 0 | $16.87 | hold | 7.50 | $16.00 |" in lines
    assert "| 20 / 5 (the defaults) | 60 | 19.44 | 20.44 | 20.44 | 0 | $13.88 | hold | — | — |" in lines
    assert "**met with LEASE_SECONDS 6 / HEARTBEAT_SECONDS 2 (p99 6.97 s (0.70x of 10 s)" in text
    assert "**not by** 20 / 5 (p99 20.44 s (2.04x of 10 s)" in text
    dear = {"rows": [_loss_row(6, 2, 6.97, 25.0)]}
    assert "**missed by every setting**" in "\n".join(host_loss.section(dear, None))


def _delivery(worker_dense: float, worker_sparse: float) -> dict[str, Any]:
    config = {"name": "full", "dense_connections": 200, "dense_rate": 100.0}
    config |= {"sparse_connections": 5000, "sparse_rate": 1.0, "repeats": 3}
    return {
        "date": "2026-12-08",
        "config": config,
        "variants": [{"name": "bare"}, {"name": "worker"}],
        "medians": {
            "dense": {"bare": 30_000.0, "worker": worker_dense},
            "sparse": {"bare": 20_000.0, "worker": worker_sparse},
        },
    }


def test_p5_limit_section_computes_the_ratio_verdicts_and_shows_the_previous_ratios() -> None:
    was = {"date": "2026-12-06", "value": _delivery(15_000.0, 6_000.0)}
    lines = delivery_report.section(_delivery(19_000.0, 9_000.0), was)
    text = "\n".join(lines)
    assert "| worker (as shipped) | 19,000 | 0.63 | 9,000 | 0.45 | 0.50 | 0.30 |" in lines
    assert "**dense 0.633x bare: met** (>= 0.6)" in text
    assert "**sparse 0.450x bare: missed** (>= 0.6)" in text
    assert "Dense = 200 connections × 100 msg/s, sparse = 5,000 × 1 msg/s" in text
    edge = "\n".join(delivery_report.section(_delivery(17_900.0, 12_100.0), None))
    assert "**dense 0.597x bare: missed**" in edge and "**sparse 0.605x bare: met**" in edge


def _p6_row(all_s: float, lost: float, *, workers: int = 9) -> dict[str, Any]:
    return {
        "lease_mode": "session",
        "workers": workers,
        "max_connections": 1117,
        "connections": 10_000,
        "expected_owned": 10_000,
        "all_s": all_s,
        "first_subscribe_s": 6.0,
        "claims_per_s": 10_000 / all_s,
        "ceiling": {"writes_per_s": 700.0},
        "of_ceiling": 10_000 / all_s / 700.0,
        "claim_metrics": {"c0": {"LeasesAcquired": 5000.0, "LeaseContention": lost}},
        "cpu_ms_per_claim": {"dynamodb_local": 2.0, "feed": 0.75, "workers": 4.2},
    }


def test_p6_ceiling_section_judges_ten_thousand_in_twenty_seconds() -> None:
    was = {"date": "2026-12-05", "value": {"rows": [_p6_row(44.0, 17) | {"label": "13:43", "code": "after"}]}}
    lines = p6_report.section({"date": "2026-12-08", "rows": [_p6_row(18.0, 3)]}, was)
    text = "\n".join(lines)
    assert (
        "| 2026-12-08 | this run | session, 9 workers, 10,000 | 18.0 | 6.0 | 556 | 700 | 79 % | 3 |" in text
    )
    assert "| previous run (2026-12-05 13:43) | after | session, 9 workers, 10,000 | 44.0 |" in text
    assert "**met**, 18.0 s (0.90x) for 10,000 on 9 workers against 20 s" in text
    assert "previous run (2026-12-05): **missed**, 44.0 s (2.20x)" in text
    slow = "\n".join(p6_report.section({"date": "2026-12-08", "rows": [_p6_row(25.0, 0)]}, None))
    assert "**missed**, 25.0 s (1.25x)" in slow


def test_keep_moves_the_old_value_one_level_deep_and_seed_fills_only_what_is_missing(tmp_path: Path) -> None:
    results: dict[str, Any] = {"date": "2026-12-04T19:50:46+00:00", "p5": {"sinks": {}}, "previous": {}}
    previous.keep(results, "p5")
    results["p5"] = {"sinks": {"file": 1}, "date": "2026-12-08", "previous": {"x": 1}}
    previous.keep(results, "p5")
    assert results["previous"]["p5"] == {
        "date": "2026-12-08",
        "value": {"sinks": {"file": 1}, "date": "2026-12-08"},
    }
    for name in ("p2-handoff.json", "host-loss.json", "p5-delivery.json", "p6-target.json"):
        (tmp_path / name).write_text((DOCS / name).read_text())
    seeded = previous.seed({"p2": {"runs": []}}, tmp_path)["previous"]
    assert set(seeded) == {"host_loss", "p5_limit", "p6_target"}  # p2 is in results: nothing to seed
    assert seeded["host_loss"]["date"] == "2026-12-06"
    assert [r["label"] for r in seeded["p6_target"]["value"]["rows"]] == ["13:20", "13:30", "13:38", "13:43"]
    p2 = previous.seed({}, tmp_path)["previous"]["p2"]["value"]["runs"]
    assert [r["hints_unread"] for r in (run["derived"] for run in p2) if r["hints_unread"]] == [7]


def test_an_undated_part_keeps_the_date_of_the_run_it_came_from_not_this_runs() -> None:
    # `designs` runs first and stamps results["date"] with today's date; a part whose old value
    # carries no date of its own must not be labelled with it (seen: P6's "previous run" dated
    # the same day as the run replacing it).
    results: dict[str, Any] = {"date": "2026-12-08T01:28:42+00:00", "p6": {"rows": []}, "previous": {}}
    previous.keep(results, "p6", run_date="2026-12-04T19:50:46+00:00")
    assert results["previous"]["p6"]["date"] == "2026-12-04T19:50:46+00:00"


def test_report_only_renders_every_hand_written_section_from_the_seeded_data(tmp_path: Path) -> None:
    # As before any of issue 25's parts ran: the sections come from the dated JSON files the
    # hand-written sections were made from, whatever today's results.json holds.
    current = json.loads((DOCS / "results.json").read_text())
    for part in ("p2", "host_loss", "p5_limit", "p6", "previous"):
        current.pop(part, None)
    results = previous.seed(current, DOCS)
    write_report(results, tmp_path / "benchmarks.md", tmp_path)
    text = (tmp_path / "benchmarks.md").read_text()
    for heading in (
        "### P2 at production timings, traced (issue 25, 2026-12-05)",
        "### Host loss at production timings, session mode (issue 25, 2026-12-06)",
        "### P5 against its limit: the delivery path beside a bare websockets loop (issue 25, 2026-12-06)",
        "### P6 against a measured ceiling (issue 25, 2026-12-05)",
    ):
        assert heading in text
    assert "| 13:54 | same | 60 | 206 | 244 | 244 | 50 / 105 | 43 / 84 | 0 |" in text
    assert "**borderline**: p99 256 ms (1.02x the goal), 244 ms (0.98x the goal)" in text
