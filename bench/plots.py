"""PNG plots for docs/benchmarks.md (matplotlib is a dev-only dependency).

Designs whose figures coincide (connection mode and the seed's parameters write alike; session
mode with and without the supervisor too) would hide one line under another, so each series has
its own line style and marker: a wide translucent line with hollow markers under a thin dashed or
dotted one with small filled markers. Both stay visible where they overlap.

`python -m bench.plots` redraws every plot from docs/bench/results.json without running anything.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.model import PARTITION_WRU_CEILING, totals, workers_for

CONNECTION_AXIS = (60, 100, 200, 500, 1000, 2000, 5000, 10000)

# Wide and hollow, then thin and filled, alternating: a thin series drawn over a wide one it
# coincides with shows as a dashed line inside a band, each with its own marker.
SERIES_STYLES: tuple[dict[str, Any], ...] = (
    {
        "linestyle": "-",
        "linewidth": 4.0,
        "alpha": 0.45,
        "marker": "o",
        "markersize": 10,
        "markerfacecolor": "none",
    },
    {"linestyle": "--", "linewidth": 1.6, "marker": "s", "markersize": 4},
    {
        "linestyle": "-",
        "linewidth": 4.0,
        "alpha": 0.45,
        "marker": "D",
        "markersize": 10,
        "markerfacecolor": "none",
    },
    {"linestyle": ":", "linewidth": 2.0, "marker": "^", "markersize": 5},
)
# The designs in the order that puts each pair that coincides into a wide + thin pair.
DESIGN_ORDER = ("seed", "connection", "session", "session+supervisor")


def series_style(index: int) -> dict[str, Any]:
    """Line keywords for the index-th series of a plot (colours come from matplotlib's cycle)."""
    return dict(SERIES_STYLES[index % len(SERIES_STYLES)])


def ordered_designs(designs: dict[str, Any]) -> list[str]:
    """The known designs in DESIGN_ORDER (coinciding pairs adjacent), then any others."""
    known = [name for name in DESIGN_ORDER if name in designs]
    return known + [name for name in designs if name not in known]


def stamp(figure: Any, results: dict[str, Any]) -> None:
    """When and on what the figures were measured, in the corner: a PNG is often seen alone."""
    machine = results.get("machine", {})
    date = str(results.get("date", ""))[:10]
    text = f"{date}, {machine.get('cores', '?')} cores, {results.get('mode', '')} run"
    figure.text(0.995, 0.005, text, ha="right", va="bottom", fontsize=7, color="0.4")


def takeover_plot(results: dict[str, Any], path: Path) -> None:
    designs = results["designs"]
    names = ordered_designs(designs)
    figure, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
    for axis, key, title in (
        (axes[0], "takeover_kill", "P1 crash takeover (SIGKILL)"),
        (axes[1], "handoff_term", "P2 graceful handoff (SIGTERM)"),
    ):
        data = [
            [s for s in designs[d][key]["samples"] if isinstance(s, float | int) and math.isfinite(s)]
            for d in names
        ]
        # A black median: the default orange one vanished among the orange points of a design.
        axis.boxplot(data, tick_labels=names, whis=(0, 100), medianprops={"color": "k", "linewidth": 1.5})
        for i, samples in enumerate(data, start=1):
            axis.scatter([i] * len(samples), samples, s=6, alpha=0.4)
            if not samples:  # this design was not run for this measure: say so, not an empty slot
                axis.text(
                    i,
                    0.5,
                    "not measured",
                    transform=axis.get_xaxis_transform(),
                    ha="center",
                    va="center",
                    rotation=90,
                    fontsize=8,
                    color="0.4",
                )
        axis.set_title(title)
        if any(samples for samples in data):  # the smoke run kills nothing
            axis.set_yscale("log")  # the fence path's ~0.5 s beside the seed's ~100 s
        axis.set_ylabel("seconds until resubscribed elsewhere (real)")
        axis.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    stamp(figure, results)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def units_plot(results: dict[str, Any], path: Path) -> None:
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    designs = results["designs"]
    for index, name in enumerate(ordered_designs(designs)):
        result = designs[name]
        points = [totals(result, n, workers_for(n)) for n in CONNECTION_AXIS]
        style = series_style(index)
        for axis, measure in ((axes[0], "wru_per_connection_hour"), (axes[1], "rru_per_connection_hour")):
            axis.plot(CONNECTION_AXIS, [p[measure] for p in points], label=name, color=f"C{index}", **style)
        measured = result["measured"]
        axes[0].scatter(
            [measured["connections"]], [measured["wru_per_connection_hour"]], s=80, marker="x", color="k"
        )
    for axis, label in (
        (axes[0], "write units per connection-hour"),
        (axes[1], "read units per connection-hour"),
    ):
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("connections (workers = max(3, N/500))")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3, which="both")
        axis.legend()
    axes[0].set_title("P3 write units (x: measured run)")
    axes[1].set_title("P3 read units")
    figure.tight_layout()
    stamp(figure, results)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def partition_plot(results: dict[str, Any], path: Path) -> None:
    figure, axis = plt.subplots(figsize=(6, 4))
    designs = results["designs"]
    for index, name in enumerate(ordered_designs(designs)):
        rates = [
            totals(designs[name], n, workers_for(n))["hottest_index_partition_wru_per_s"]
            for n in CONNECTION_AXIS
        ]
        axis.plot(CONNECTION_AXIS, rates, label=name, color=f"C{index}", **series_style(index))
    axis.axhline(PARTITION_WRU_CEILING, color="r", linestyle="--", label="1,000 WRU/s per partition")
    axis.set_xscale("log")
    axis.set_xlabel("connections")
    axis.set_ylabel("WRU/s on the hottest index partition (steady state)")
    axis.set_title("P7 index hot partition")
    axis.grid(alpha=0.3, which="both")
    axis.legend()
    figure.tight_layout()
    stamp(figure, results)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_plots(results: dict[str, Any], out: Path) -> None:
    takeover_plot(results, out / "takeover.png")
    units_plot(results, out / "units.png")
    partition_plot(results, out / "partition.png")
    from bench.capacity_plots import cold_start_plot, rss_plot

    if "p5" in results:
        rss_plot(results["p5"], out / "rss.png")
    if "p6" in results:
        cold_start_plot(results["p6"], out / "cold_start.png")
    if "simulator" in results:
        from bench.simulator.output import convergence_plot

        convergence_plot(results["simulator"], out / "simulator.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.plots", description="Redraw the plots from a results.json; runs nothing."
    )
    parser.add_argument(
        "--out", type=Path, default=Path("docs/bench"), help="where results.json is and the PNGs go"
    )
    args = parser.parse_args(argv)
    saved = args.out / "results.json"
    try:
        results = json.loads(saved.read_text())
    except (OSError, ValueError) as error:
        parser.exit(1, f"error: cannot read {saved}: {error}\n")
    write_plots(results, args.out)
    print(f"plots written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
