"""PNG plots for docs/benchmarks.md (matplotlib is a dev-only dependency)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.model import PARTITION_WRU_CEILING, totals, workers_for

CONNECTION_AXIS = (60, 100, 200, 500, 1000, 2000, 5000, 10000)


def takeover_plot(results: dict[str, Any], path: Path) -> None:
    designs = results["designs"]
    figure, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
    for axis, key, title in (
        (axes[0], "takeover_kill", "P1 crash takeover (SIGKILL)"),
        (axes[1], "handoff_term", "P2 graceful handoff (SIGTERM)"),
    ):
        data = [
            [s for s in designs[d][key]["samples"] if isinstance(s, float | int) and math.isfinite(s)]
            for d in designs
        ]
        axis.boxplot(data, tick_labels=list(designs), whis=(0, 100))
        for i, samples in enumerate(data, start=1):
            axis.scatter([i] * len(samples), samples, s=6, alpha=0.4)
        axis.set_title(title)
        if any(samples for samples in data):  # the smoke run kills nothing
            axis.set_yscale("log")  # the fence path's ~0.5 s beside the seed's ~100 s
        axis.set_ylabel("seconds until resubscribed elsewhere (real)")
        axis.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def units_plot(results: dict[str, Any], path: Path) -> None:
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, result in results["designs"].items():
        points = [totals(result, n, workers_for(n)) for n in CONNECTION_AXIS]
        axes[0].plot(CONNECTION_AXIS, [p["wru_per_connection_hour"] for p in points], marker="o", label=name)
        axes[1].plot(CONNECTION_AXIS, [p["rru_per_connection_hour"] for p in points], marker="o", label=name)
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
    figure.savefig(path, dpi=110)
    plt.close(figure)


def partition_plot(results: dict[str, Any], path: Path) -> None:
    figure, axis = plt.subplots(figsize=(6, 4))
    for name, result in results["designs"].items():
        rates = [
            totals(result, n, workers_for(n))["hottest_index_partition_wru_per_s"] for n in CONNECTION_AXIS
        ]
        axis.plot(CONNECTION_AXIS, rates, marker="o", label=name)
    axis.axhline(PARTITION_WRU_CEILING, color="r", linestyle="--", label="1,000 WRU/s per partition")
    axis.set_xscale("log")
    axis.set_xlabel("connections")
    axis.set_ylabel("WRU/s on the hottest index partition (steady state)")
    axis.set_title("P7 index hot partition")
    axis.grid(alpha=0.3, which="both")
    axis.legend()
    figure.tight_layout()
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
