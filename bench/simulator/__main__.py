"""`python -m bench.simulator --size tiny|full --out DIR`: simulator.json, simulator.png, a table."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

from bench.designs import runnable
from bench.simulator.output import MODELLED, REAL, convergence_plot, table
from bench.simulator.scenario import SIZES, simulate
from leaseworker.observability.logging import configure_logging


def run(size_name: str, out: Path, *, seed: int = 12, designs: list[str] | None = None) -> dict[str, Any]:
    configure_logging("CRITICAL", stream=io.StringIO())  # the workers' logs are not the figures
    size = SIZES[size_name]
    results: dict[str, Any] = {
        "size": size.name,
        "connections": size.connections,
        "workers": size.workers,
        "killed": size.killed,
        "added": size.added,
        "period": size.period,
        "seed": seed,
        "real": list(REAL),
        "modelled": list(MODELLED),
        "designs": {},
    }
    for design in runnable():
        if designs is not None and design.name not in designs:
            continue
        results["designs"][design.name] = simulate(design, size, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "simulator.json").write_text(json.dumps(results, indent=1))
    convergence_plot(results, out / "simulator.png")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.simulator")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--designs", nargs="+", default=None, help="only these designs [default: all]")
    args = parser.parse_args()
    results = run(args.size, args.out, seed=args.seed, designs=args.designs)
    print(table(results))


if __name__ == "__main__":
    main()
