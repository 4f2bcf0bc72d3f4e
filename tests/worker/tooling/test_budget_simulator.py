"""bench/simulator/budgets.py at a small size: with budgets the reconnects after worker deaths
are paced exactly as docs/tuning.md §6 predicts and never refused; without, they are refused."""

from __future__ import annotations

import pytest

import bench.simulator.budgets as sim
from leaseworker.lease.budget_store import STEPS


@pytest.fixture(autouse=True)
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "CONNECTIONS": 2000,
        "HOSTS": 10,
        "WORKERS": 20,
        "KILLED": 2,
        "HORIZON_S": 120.0,
    }.items():
        monkeypatch.setattr(sim, name, value)


def test_budgets_pace_the_reconnects_as_predicted() -> None:
    result = sim.simulate("coinbase", True)
    assert result["connects"] == 200 and result["still_down"] == 0
    assert result["refused_429"] == 0 and result["refused_418"] == 0
    assert result["peak_per_window"] <= 8
    assert result["predicted_paced_s"] > 0
    # The prediction counts each window's expiry rounded up a whole step (1/STEPS of it); the
    # rounding to absolute steps may take less.
    assert (
        result["predicted_paced_s"] / (1 + 1 / STEPS)
        <= result["converged_s"]
        <= result["predicted_paced_s"] + sim.CONNECT_S + 0.05
    )


def test_without_budgets_the_reconnects_are_refused() -> None:
    result = sim.simulate("coinbase", False)
    assert result["refused_429"] > 0 and result["bans"] > 0  # the storm, then the ban it earns
    assert result["converged_s"] is None and result["still_down"] > 0  # a ban drops the whole host
