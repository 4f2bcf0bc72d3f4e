"""`python -m bench.simulator --size tiny|full --out DIR`: simulator.json, simulator.png, a table."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.designs import runnable
from bench.simulator.output import MODELLED, REAL, convergence_plot, table
from bench.simulator.scenario import SIZES, simulate


def run(size_name: str, out: Path, *, fidelity: str | None = None, seed: int = 12) -> dict[str, Any]:
    size = SIZES[size_name]
    if fidelity is not None:
        size = type(size)(size.name, size.connections, size.workers, size.killed, size.added, fidelity)
    results: dict[str, Any] = {
        "size": size.name,
        "connections": size.connections,
        "workers": size.workers,
        "killed": size.killed,
        "added": size.added,
        "fidelity": size.fidelity,
        "seed": seed,
        "real": list(REAL),
        "modelled": list(MODELLED),
        "designs": {},
    }
    for design in runnable():
        results["designs"][design.name] = simulate(design, size, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "simulator.json").write_text(json.dumps(results, indent=1))
    convergence_plot(results, out / "simulator.png")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.simulator")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--fidelity", choices=("exact", "batched"), default=None)
    parser.add_argument("--seed", type=int, default=12)
    args = parser.parse_args()
    results = run(args.size, args.out, fidelity=args.fidelity, seed=args.seed)
    print(table(results))


if __name__ == "__main__":
    main()
