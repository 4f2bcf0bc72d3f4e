"""The simulator's outputs: the summary table, the convergence plot, the docs/benchmarks.md section."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

REAL = (
    "the Worker and every loop it runs (worker/main.py `coordination`: acquirer, keeper, "
    "checkpointer, heartbeat, peer watch), the sessions, their socket loop and the seqfeed/1 "
    "adapter, the lease stores and admin.add: `make sim`'s fleet (bench/simulator/dst/world.py)",
    "DynamoDB's conditional writes and its cost rules (bench/capacity.py) in the in-memory client, "
    "which answers the store calls as DynamoDB Local does (tests/worker/tooling/test_simulator.py)",
    "the sink's order of arrival, judged for S1 and S2 (bench/simulator/dst/checks.py)",
)
MODELLED = (
    "the feeds: in-memory seqfeed/1 sockets, one message per connection per period",
    "DynamoDB's latency: 2-20 ms per call, no errors; no SQS hints (the peer watch and the "
    "reconcile are the paths)",
    "one wall clock for all workers (no skew); deaths are host losses (no release)",
)


def _fmt(value: float | None, digits: int = 1) -> str:
    return "not reached" if value is None else f"{value:.{digits}f}"


def rows(results: dict[str, Any]) -> list[list[str]]:
    out = []
    for name, r in results["designs"].items():
        s, d, o = r["steady"], r["death"], r["scale_out"]
        out.append(
            [
                name,
                f"{s['rru_per_worker_s']['mean']:.2f} / {s['rru_per_worker_s']['max']:.2f}",
                f"{s['wru_per_worker_s']['mean']:.2f} / {s['wru_per_worker_s']['max']:.2f}",
                f"{s['wru_per_connection_hour']:.1f}",
                _fmt(d["convergence_seconds"]),
                f"{o['moves']} ({o['moves_to_new']} to the new)",
                _fmt(o["balanced_seconds"]) + f" (limit {o['limit_seconds']:.0f})",
                f"{o['max_load']} / {o['fair_share']}",
                _fmt(r["cold_start_seconds"]),
                f"{r['cpu_seconds']:.0f}",
            ]
        )
    return out


HEADER = [
    "design",
    "RRU/s per worker (mean / max)",
    "WRU/s per worker (mean / max)",
    "WRU per connection-hour",
    "convergence after deaths (s)",
    "moves after scale-out",
    "balanced after (s)",
    "max load / fair share",
    "cold start (s)",
    "CPU (s)",
]


def table(results: dict[str, Any]) -> str:
    body = [HEADER, *rows(results)]
    widths = [max(len(row[i]) for row in body) for i in range(len(HEADER))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in body)


def convergence_plot(results: dict[str, Any], path: Path) -> None:
    figure, axis = plt.subplots(figsize=(7, 4))
    for name, r in results["designs"].items():
        curve = r["death"]["curve"]
        axis.plot([t for t, _ in curve], [n for _, n in curve], label=name)
    axis.axhline(results["connections"], color="k", linestyle=":", linewidth=1)
    axis.set_xlabel(f"virtual seconds after {results['killed']} of {results['workers']} workers died")
    axis.set_ylabel("connections owned by a live worker")
    axis.set_title(f"Simulated convergence ({results['connections']:,} connections)")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def section(results: dict[str, Any]) -> list[str]:
    """Markdown lines for docs/benchmarks.md."""
    lines = [
        "## Beyond one machine: the coordination simulator",
        "",
        f"{results['connections']:,} connections, {results['workers']} workers; {results['killed']} die, "
        f"then {results['added']} join; each feed sends a message every {results['period']:g} s. "
        "Virtual time, production timings per design "
        f"(`python -m bench.simulator --size {results['size']}`).",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
        *("| " + " | ".join(row) + " |" for row in rows(results)),
        "",
        "![convergence](simulator.png)",
        "",
        "Real code: " + "; ".join(REAL) + ".",
        "",
        "Stand-ins: " + "; ".join(MODELLED) + ".",
    ]
    bad = {n: r["violations"] for n, r in results["designs"].items() if r["violations"]}
    lines += ["", f"Invariant violations: {bad or 'none'}."]
    return lines
