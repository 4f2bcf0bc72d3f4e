"""`make bench`: every design side by side on real local fleets; JSON, markdown and plots.

.venv/bin/python -m bench.run --mode quick   # about 5 minutes
.venv/bin/python -m bench.run --mode full
.venv/bin/python -m bench.run --mode full --parts simulator   # one part; the others are kept

Parts: `designs` (P1-P4, P7 on real fleets), `p5` (one process's capacity), `p6` (cold start),
`simulator` (the real workers of 10,000 connections and 10 workers, in virtual time), `p8` (generic/1 against
seqfeed/1 in one worker process). A run of some parts keeps
the others' results from <out>/results.json, so the report always shows every part.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import subprocess
from pathlib import Path
from typing import Any

from bench.designs import runnable
from bench.fleet_run import CONFIGS, Config, run_design
from bench.listing import listing_cost
from bench.model import (
    FLEET_SIZES,
    measured_totals,
    partition_ceiling,
    reads_per_worker_heartbeat,
    totals,
    workers_for,
)


def machine() -> dict[str, Any]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    java = subprocess.run(
        ["java", "-version"], capture_output=True, text=True, check=False
    ).stderr.splitlines()
    return {
        "cpu": cpu,
        "cores": len(
            [line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("processor")]
        ),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "java": java[0] if java else "",
    }


def run(config: Config, designs: list[str] | None = None, *, keep: Path | None = None) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for design in runnable():
        if designs and design.name not in designs:
            continue
        result = run_design(design, config, keep=keep)
        result |= {"connections": config.connections, "workers": config.workers}
        result["measured"] = measured_totals(result)
        result["fleets"] = {str(n): totals(result, n, workers_for(n)) for n in FLEET_SIZES}
        result["partition_ceiling_connections"] = partition_ceiling(result)
        results[design.name] = result
    listing: dict[str, Any] = {}
    session = results.get("session")
    if session:
        prices = listing_cost(session["session_items"], session["read_samples"], list(config.listing_counts))
        listing = {"prices": prices, "rru_per_worker_heartbeat": reads_per_worker_heartbeat(session, prices)}
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "mode": config.name,
        "config": config.__dict__,
        "machine": machine(),
        "designs": results,
        "listing": listing,
    }


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


PARTS = ("designs", "p5", "p6", "simulator", "p8")
# The simulator's size per bench mode: its full size takes minutes of CPU, not of waiting.
SIMULATOR_SIZE = {"quick": "tiny", "full": "full", "tiny": "tiny", "smoke": "tiny"}
CAPACITY_MODE = {"quick": "quick", "full": "full", "tiny": "tiny", "smoke": "tiny"}


def run_parts(
    mode: str,
    parts: list[str],
    *,
    designs: list[str] | None,
    previous: dict[str, Any],
    out: Path,
    keep: Path | None,
) -> dict[str, Any]:
    results = dict(previous)
    if "designs" in parts:
        results |= run(CONFIGS[mode], designs, keep=keep)
    if "p5" in parts:
        from bench import process_capacity

        results["p5"] = process_capacity.run(CAPACITY_MODE[mode])
    if "p6" in parts:
        from bench import cold_start

        results["p6"] = cold_start.run(CAPACITY_MODE[mode])
    if "simulator" in parts:
        from bench.simulator.__main__ import run as simulate

        results["simulator"] = simulate(SIMULATOR_SIZE[mode], out)
    if "p8" in parts:
        from bench import generic_vs_seqfeed

        results["p8"] = generic_vs_seqfeed.run(CAPACITY_MODE[mode])
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", choices=sorted(CONFIGS), default="quick")
    parser.add_argument("--design", action="append", help="run only this design (repeatable)")
    parser.add_argument("--out", type=Path, default=Path("docs/bench"), help="results.json and plots go here")
    parser.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"), help="the markdown report")
    parser.add_argument("--keep", type=Path, help="keep each design's fleet logs and sink under this folder")
    parser.add_argument("--no-docs", action="store_true", help="write the JSON only")
    parser.add_argument("--report-only", action="store_true", help="re-render docs from <out>/results.json")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    args = parser.parse_args()
    saved = args.out / "results.json"
    previous: dict[str, Any] = json.loads(saved.read_text()) if saved.exists() else {}
    if args.report_only:
        results = previous
    else:
        parts = [part for part in args.parts.split(",") if part]
        unknown = sorted(set(parts) - set(PARTS))
        if unknown:
            parser.error(f"unknown parts {unknown}; choose from {', '.join(PARTS)}")
        args.out.mkdir(parents=True, exist_ok=True)
        results = run_parts(
            args.mode, parts, designs=args.design, previous=previous, out=args.out, keep=args.keep
        )
        saved.write_text(json.dumps(_finite(results), indent=1, sort_keys=True) + "\n")
    if not args.no_docs:
        from bench.plots import write_plots
        from bench.report import write_report

        write_plots(results, args.out)
        write_report(results, args.doc, args.out)
    print(json.dumps(_finite({k: v["measured"] for k, v in results.get("designs", {}).items()}), indent=1))


if __name__ == "__main__":
    main()
