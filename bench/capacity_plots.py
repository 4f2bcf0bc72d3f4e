"""PNG plots for P5 (RSS against connections) and P6 (connections subscribed over time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.plots import series_style


def rss_plot(results: dict[str, Any], path: Path) -> None:
    """The worker child's RSS against connections held, one line per sink, with the 60 KB/connection
    target drawn from the first sink's baseline."""
    from bench.process_capacity import TARGET_KB_PER_CONNECTION

    figure, axis = plt.subplots(figsize=(6, 4))
    top = 0
    for index, (sink, ramp) in enumerate(results["sinks"].items()):
        points = [(0, ramp["baseline_rss_bytes"])] + [(s["held_feed"], s["rss_bytes"]) for s in ramp["steps"]]
        top = max(top, points[-1][0])
        # The sinks' lines coincide (that is the finding): their styles keep both visible.
        axis.plot(
            [n for n, _ in points],
            [r / 2**20 for _, r in points],
            label=f"{sink} sink",
            color=f"C{index}",
            **series_style(index),
        )
    baseline = next(iter(results["sinks"].values()))["baseline_rss_bytes"] / 2**20
    axis.plot(
        [0, top],
        [baseline, baseline + top * TARGET_KB_PER_CONNECTION / 1024],
        color="r",
        linestyle="--",
        label=f"baseline + {TARGET_KB_PER_CONNECTION:g} KB/connection",
    )
    axis.set_xlabel("connections held by one worker process")
    axis.set_ylabel("worker RSS (MB)")
    axis.set_title("P5 RSS against connections")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def cold_start_plot(results: dict[str, Any], path: Path) -> None:
    """Connections subscribed against seconds since the workers started, one line per row."""
    figure, axis = plt.subplots(figsize=(6, 4))
    drawn = 0
    for row in results["rows"]:
        curve = row["curve"]
        if not curve:
            continue
        counts = [row["subscribed"] * i / 100 for i in range(len(curve))]
        style = series_style(drawn) | {"marker": None}  # 100 points a curve: lines only
        axis.plot(
            curve, counts, label=f"{row['lease_mode']}, {row['workers']} workers", color=f"C{drawn}", **style
        )
        drawn += 1
    ceiling = results["ceiling_writes_per_s"]
    top = results["config"]["connections"]
    axis.plot([0, top / ceiling], [0, top], color="r", linestyle="--", label=f"{ceiling:g} claims/s")
    axis.set_xlabel("seconds since the workers started")
    axis.set_ylabel("connections subscribed")
    axis.set_title(f"P6 cold start of {top:,} connections")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
