"""`make bench`: every design side by side on real local fleets; JSON, markdown and plots.

.venv/bin/python -m bench.run --mode quick   # about 5 minutes
.venv/bin/python -m bench.run --mode full
.venv/bin/python -m bench.run --mode full --parts simulator   # one part; the others are kept

Parts: `designs` (P1-P4, P7 on real fleets), `p5` (one process's capacity), `p6` (cold start, each
row against its measured write ceiling), `simulator` (the real workers of 10,000 connections and 10
workers, in virtual time), `p8` (generic/1 against seqfeed/1 in one worker process), and issue 25's:
`p2` (a graceful handoff traced at production timings), `host_loss` (session mode's lease path at
production timings, the defaults and 6 / 2), `p5_limit` (the delivery path beside a bare websockets
loop). A run of some parts keeps the others' results from <out>/results.json, so the report always
shows every part; the value a part replaces is kept under `previous` (bench/previous.py), and the
report shows it beside the new figure.
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


PARTS = ("designs", "p5", "p6", "simulator", "p8", "p2", "host_loss", "p5_limit")
# The simulator's size per bench mode: its full size takes minutes of CPU, not of waiting.
SIMULATOR_SIZE = {"quick": "tiny", "full": "full", "tiny": "tiny", "smoke": "tiny"}
CAPACITY_MODE = {"quick": "quick", "full": "full", "tiny": "tiny", "smoke": "tiny"}
# bench/handoff_trace.py per bench mode: (connections, workers, SIGTERM rounds); full = issue 25's runs.
HANDOFF_SIZE = {"tiny": (8, 2, 1), "smoke": (8, 2, 1), "quick": (40, 4, 2), "full": (80, 4, 3)}
HANDOFF_RATE = 5.0


def _code() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "this checkout"


def run_p2(mode: str) -> dict[str, Any]:
    """The `p2` part: one handoff_trace run, its per-connection step differences summarised."""
    from bench import handoff_trace
    from bench.handoff_report import derive

    connections, workers, rounds = HANDOFF_SIZE[mode]
    out = handoff_trace.run(
        connections=connections, workers=workers, rounds=rounds, rate=HANDOFF_RATE, mode="session", keep=None
    )
    steps = {f"{i}/{cid}": s for i, r in enumerate(out["rounds"]) for cid, s in r["steps"].items()}
    now = datetime.datetime.now(datetime.UTC).strftime("%H:%M")
    run = {
        "label": now,
        "code": f"this run ({_code()})",
        "final": True,
        "p2_ms": out["p2_ms"],
        "invariants_ok": out["invariants_ok"],
        "rounds": [{"victim": r["victim"], "summary": r["summary"]} for r in out["rounds"]],
        "derived": derive(steps),
    }
    config = {"connections": connections, "workers": workers, "rounds": rounds, "rate": HANDOFF_RATE}
    return {"config": config, "runs": [run]}


def run_host_loss(mode: str) -> dict[str, Any]:
    """The `host_loss` part: both settings of bench/host_loss.py on a fleet of the mode's size."""
    from bench import host_loss

    config = CONFIGS[mode]
    rows = [host_loss.measure(host_loss.SETTINGS[name], config) for name in ("default", "fast")]
    size = {"workers": config.workers, "connections": config.connections, "kills": config.kills}
    return {"config": size, "rows": rows}


def run_p5_limit(mode: str) -> dict[str, Any]:
    """The `p5_limit` part: bench/delivery.py's bare loop and worker (and uvloop where installed)."""
    import importlib.util

    from bench import delivery

    variants = [delivery.Variant("bare", "bare"), delivery.Variant("worker", "worker")]
    if importlib.util.find_spec("uvloop") is not None:
        variants.append(delivery.Variant("worker + uvloop", "worker", loop="uvloop"))
    return delivery.run(CAPACITY_MODE[mode], variants, 10.0)


def run_parts(
    mode: str,
    parts: list[str],
    *,
    designs: list[str] | None,
    previous: dict[str, Any],
    out: Path,
    keep: Path | None,
) -> dict[str, Any]:
    from bench import previous as kept

    results = kept.seed(dict(previous), out)
    run_date = results.get("date")  # the date of the run the parts' undated values came from
    if "designs" in parts:
        kept.keep(results, "designs")
        results |= run(CONFIGS[mode], designs, keep=keep)
    for part in parts:
        if part == "designs":
            continue
        kept.keep(results, part, run_date=run_date)
        value = _run_part(part, mode, out)
        stamp = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "mode": mode}
        results[part] = value | stamp if isinstance(value, dict) else value
    return results


def _run_part(part: str, mode: str, out: Path) -> Any:
    if part == "p5":
        from bench import process_capacity

        return process_capacity.run(CAPACITY_MODE[mode])
    if part == "p6":
        from bench import cold_start

        return cold_start.run(CAPACITY_MODE[mode])  # full: its 9-worker session row is issue 25's target
    if part == "simulator":
        from bench.simulator.__main__ import run as simulate

        return simulate(SIMULATOR_SIZE[mode], out)
    if part == "p8":
        from bench import generic_vs_seqfeed

        return generic_vs_seqfeed.run(CAPACITY_MODE[mode])
    runners = {"p2": run_p2, "host_loss": run_host_loss, "p5_limit": run_p5_limit}
    return runners[part](mode)


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
        from bench.previous import seed

        results = seed(previous, args.out)  # in memory only: results.json is not written
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
