"""The previous run's figures beside this run's: `results["previous"][key]` = {"date", "value"}.

Before a part overwrites its key in results.json, `keep` moves the old value there (one level:
a previous value never holds a previous of its own). The first time, `seed` fills what is missing
from the data the hand-written sections of docs/benchmarks.md were made from (issue 25,
2026-12-05 and 2026-12-06): docs/bench/p2-handoff.json, host-loss.json, p5-delivery.json (and
p5-delivery-max-queue.json) and p6-target.json, which stay in the repository.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

# Parts whose key in results.json is the top-level run (date, mode, config, machine, designs, listing).
DESIGN_KEYS: Final = ("designs", "listing", "config", "mode", "machine")

# handoff_trace.py kept per-step summaries only, not each connection's steps, for the runs of
# 2026-12-05, so the per-connection differences it printed then are recorded here as printed.
P2_DERIVED_2026_12_05: Final = {
    "p2before": (91, 170, 41, 127),
    "p2before2": (100, 152, 32, 98),
    "p2after": (42, 233, 29, 118),
    "p2after2": (22, 77, 39, 97),
    "p2after3": (47, 110, 50, 100),
    "p2after4": (50, 105, 43, 84),
    "p2sem2": (58, 141, 38, 102),
}
P2_CODE_2026_12_05: Final = {
    "p2before": "before",
    "p2before2": "before",
    "p2after": "after (hints batched, read before their delete)",
    "p2after2": "same",
    "p2after3": "after, and a hint for our own release passed on",
    "p2after4": "same",
    "p2sem2": "experiment, not kept: two hint batches in flight",
}
P2_FINAL_2026_12_05: Final = ("p2after3", "p2after4")
P6_CODE_2026_12_05: Final = {
    "p6before": ("13:20", "before"),
    "p6after1": ("13:30", "after (first version: a step re-read the share)"),
    "p6after2": ("13:38", "after"),
    "p6after3": ("13:43", "after"),
}


def _load(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def _p2(out: Path) -> dict[str, Any] | None:
    data = _load(out / "p2-handoff.json")
    if data is None:
        return None
    runs = []
    for key, run in data["runs"].items():
        stamp = str(data["order"][key]).split(" ", 1)[0]
        hint_p50, hint_p99, claim_p50, claim_p99 = P2_DERIVED_2026_12_05.get(key, (None,) * 4)
        unread = sum(
            r["summary"].get("released", {}).get("n", 0) - r["summary"].get("hint_read", {}).get("n", 0)
            for r in run["rounds"]
        )
        runs.append(
            {
                "label": stamp,
                "code": P2_CODE_2026_12_05.get(key, key),
                "final": key in P2_FINAL_2026_12_05,
                "p2_ms": run["p2_ms"],
                "invariants_ok": run["invariants_ok"],
                "derived": {
                    "release_to_hint_read_p50": hint_p50,
                    "release_to_hint_read_p99": hint_p99,
                    "claim_write_p50": claim_p50,
                    "claim_write_p99": claim_p99,
                    "hints_unread": max(0, unread),
                },
            }
        )
    runs.sort(key=lambda r: (r["code"].startswith("experiment"), r["code"] != "before", r["label"]))
    return {"config": {"connections": 80, "workers": 4, "rounds": 3, "rate": 5.0}, "runs": runs}


def _host_loss(out: Path) -> dict[str, Any] | None:
    rows = _load(out / "host-loss.json")
    return None if rows is None else {"rows": sorted(rows, key=lambda r: -float(r["lease_s"]))}


def _p5_limit(out: Path) -> dict[str, Any] | None:
    data = _load(out / "p5-delivery.json")
    if data is None:
        return None
    queue = _load(out / "p5-delivery-max-queue.json")
    labels = {
        "worker (before)": "worker before (bb8b5da)",
        "worker": "worker, one receive timer per socket (f76ae1c, as shipped)",
        "worker + uvloop": "worker, one receive timer + uvloop (not shipped)",
    }
    seeded: dict[str, Any] = data | {"before_code": "bb8b5da", "max_queue": queue, "labels": labels}
    return seeded


def _p6_target(out: Path) -> dict[str, Any] | None:
    data = _load(out / "p6-target.json")
    if data is None:
        return None
    runs = [
        row
        | {"label": P6_CODE_2026_12_05.get(key, (key, key))[0], "code": P6_CODE_2026_12_05.get(key, key)[1]}
        for key, row in data.items()
    ]
    return {"rows": runs}


SEEDS: Final = {
    "p2": ("2026-12-05", _p2),
    "host_loss": ("2026-12-06", _host_loss),
    "p5_limit": ("2026-12-06", _p5_limit),
    "p6_target": ("2026-12-05", _p6_target),
}


def seed(results: dict[str, Any], out: Path) -> dict[str, Any]:
    """`results` with `previous` filled from the hand-written sections' data where it lacks a key."""
    previous = dict(results.get("previous") or {})
    for key, (date, load) in SEEDS.items():
        if key not in previous and key not in results:
            value = load(out)
            if value is not None:
                previous[key] = {"date": date, "value": value}
    return results | {"previous": previous}


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k != "previous"}
    return value


def keep(results: dict[str, Any], key: str, *, run_date: str | None = None) -> None:
    """Before `key` is overwritten: its current value becomes the previous run's (one level).
    `run_date`: the date results.json had before this invocation, for a part's value that carries
    no date of its own (results["date"] may already be this run's, if `designs` ran first)."""
    previous = results.setdefault("previous", {})
    if key == "designs":
        if "designs" in results:
            old = {k: results[k] for k in DESIGN_KEYS if k in results}
            previous["designs"] = {"date": results.get("date"), "value": old}
        return
    if key not in results:
        return
    value = _strip(results[key])
    date = value.get("date") if isinstance(value, dict) else None
    previous[key] = {"date": date or run_date or results.get("date"), "value": value}


def of(results: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The previous run's {"date", "value"} for `key`, if any."""
    found = (results.get("previous") or {}).get(key)
    return found if isinstance(found, dict) else None


def shown(
    result: dict[str, Any] | None, previous: dict[str, Any] | None
) -> tuple[dict[str, Any], str, dict[str, Any] | None] | None:
    """What a section shows: (its main value, that value's date, the previous run to set beside
    it). This run's value if there is one, else the previous run's alone; None if neither."""
    if result is not None:
        return result, str(result.get("date", ""))[:10], previous
    if previous is not None:
        return previous["value"], str(previous["date"]), None
    return None
