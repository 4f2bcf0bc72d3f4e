"""The benchmark plots show every series, and redraw from the committed results without a run.

units.png and partition.png drew designs whose figures coincide (connection and seed; session
with and without the supervisor) in one style, so two of four legend entries were invisible.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest

from bench import plots

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "bench" / "results.json"


def drawn_figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Keep each figure the plot functions close, so that its lines can be read back."""
    figures: list[Any] = []
    close = plt.close

    def keep(figure: Any = None) -> None:
        figures.append(figure)
        close(figure)

    monkeypatch.setattr(plt, "close", keep)  # the module bench.plots draws with
    return figures


def line_styles(axis: Any) -> dict[str, tuple[str, str, float]]:
    """{legend label: (linestyle, marker, linewidth)} of the labelled lines of one axis."""
    return {
        line.get_label(): (line.get_linestyle(), str(line.get_marker()), line.get_linewidth())
        for line in axis.get_lines()
        if not line.get_label().startswith("_")
    }


@pytest.mark.parametrize("plot", ["units_plot", "partition_plot"])
def test_each_design_has_its_own_line_style(
    plot: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = drawn_figures(monkeypatch)
    results = json.loads(RESULTS.read_text())
    getattr(plots, plot)(results, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 0
    (figure,) = figures
    for axis in figure.axes:
        styles = line_styles(axis)
        designs = {name: style for name, style in styles.items() if name in results["designs"]}
        assert set(designs) == set(results["designs"])
        assert len(set(designs.values())) == len(designs), f"{plot}: two designs share a style: {designs}"
        # The pairs that coincide: one wide line, one narrow line drawn inside it.
        for wide, narrow in (("seed", "connection"), ("session", "session+supervisor")):
            assert designs[wide][2] > designs[narrow][2], f"{plot}: {wide} must be drawn wider than {narrow}"


def test_the_plots_redraw_from_a_results_file_alone(tmp_path: Path) -> None:
    shutil.copy(RESULTS, tmp_path / "results.json")
    assert plots.main(["--out", str(tmp_path)]) == 0
    for name in ("takeover", "units", "partition", "rss", "cold_start", "simulator"):
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000, name


def test_a_missing_results_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        plots.main(["--out", str(tmp_path)])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot read") and err.count("\n") == 1
