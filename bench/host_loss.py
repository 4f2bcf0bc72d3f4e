"""Host loss in session mode at production timings: the defaults against shorter periods.

Issue 25 item 3. A host loss is the lease path: the whole task dies (SIGKILL of the worker's
process group, supervisor included), so no fence is written and peers take over once the
worker's heartbeat counter has stood still for LEASE_SECONDS on their own clocks (docs/design.md
§2a): L1 <= LEASE + one heartbeat (the listing period) + connect. Each setting runs on its own
real local fleet (`bench/fleet_run.py`, FULL: 4 workers, 80 connections at 5 msg/s, 3 SIGKILLs of
the busiest worker, then 3 SIGTERMs) at scale 1: no period is scaled, so every second is a real
one. The steady window's DynamoDB operations are counted and priced as in P3/P4, and extrapolated
to 2,000 connections on 4 workers (`bench/model.py`).

    .venv/bin/python -m bench.host_loss [--setting default|fast] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from bench.designs import SESSION, Design
from bench.fleet_run import FULL, run_design
from bench.model import totals

SETTINGS: Final = {
    "default": replace(
        SESSION, name="session-lease20-hb5", note="the defaults: lease 20 s, heartbeat 5 s", scale=1.0
    ),
    "fast": replace(
        SESSION,
        name="session-lease6-hb2",
        note="lease 6 s, heartbeat 2 s",
        lease=6.0,
        heartbeat=2.0,
        scale=1.0,
    ),
}
HEADER: Final = (
    "| setting | n | p50 (s) | p99 (s) | max (s) | not resubscribed | $/month, 2,000 on 4 | invariants |"
)
GOAL_P99_S: Final = 10.0
GOAL_DOLLARS_2000: Final = 20.0


def measure(design: Design) -> dict[str, Any]:
    result = run_design(design, FULL)
    result |= {"connections": FULL.connections, "workers": FULL.workers}
    cost = totals(result, 2000, 4)
    return {
        "setting": design.note,
        "lease_s": design.lease,
        "heartbeat_s": design.heartbeat,
        "host_loss": result["takeover_kill"],
        "handoff": result["handoff_term"],
        "dollars_per_month_2000_on_4": cost["dollars_per_month"],
        "wru_per_s_2000": cost["wru_per_s"],
        "rru_per_s_2000": cost["rru_per_s"],
        "invariants_ok": result["invariants_ok"],
        "kinds": result["kinds"],
    }


def line(row: dict[str, Any]) -> str:
    loss = row["host_loss"]
    return (
        f"| {row['setting']} | {loss['n']} | {loss['p50']:.2f} | {loss['p99']:.2f} | {loss['max']:.2f} | "
        f"{loss['missed']} | ${row['dollars_per_month_2000_on_4']:.2f} | {row['invariants_ok']} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.host_loss", description=__doc__)
    parser.add_argument("--setting", action="append", choices=sorted(SETTINGS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows = []
    for name in args.setting or sorted(SETTINGS):
        rows.append(measure(SETTINGS[name]))
        print(line(rows[-1]), file=sys.stderr, flush=True)
    print(HEADER)
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for row in rows:
        print(line(row))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "host-loss.json").write_text(json.dumps(rows, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
