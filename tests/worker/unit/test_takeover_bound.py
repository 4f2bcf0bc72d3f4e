"""docs/design.md §2c L1, computed once (worker/takeover_bound.py): the figures docs/tuning.md
states come out of the formula the chaos verdicts, the live view and the system tests use."""

from __future__ import annotations

import pytest

from leaseworker.settings import Settings
from leaseworker.worker.takeover_bound import LeaseTimings, takeover_bound_s
from leaseworker_dev.local.fleet import FAST


@pytest.mark.parametrize(
    ("mode", "timings", "connect_s", "paced_s", "expected"),
    [
        # docs/tuning.md §1: defaults 20 / 5 / 5 / 1 give 27 s before the connect.
        ("connection", Settings(worker_id="w"), 0.0, 0.0, 27.0),
        # The local fleet's timings 3 / 1 / 1 / 0.2: 4.4 s, 5.9 s with the 1.5 s connect allowance.
        ("connection", FAST, 0.0, 0.0, 4.4),
        ("connection", FAST, 1.5, 0.0, 5.9),
        # Session mode at the same timings: 7.0 s (lease + 2 heartbeats + 2 steps of 0.25 s + 1.5).
        ("session", FAST, 1.5, 0.0, 7.0),
        # Session mode at the defaults: 20 + 10 + 0.5, before the connect.
        ("session", Settings(worker_id="w"), 0.0, 0.0, 30.5),
        # The connect budget's pacing adds on top (docs/tuning.md §6).
        ("session", FAST, 1.5, 12.0, 19.0),
    ],
)
def test_the_takeover_bound_is_the_documented_one(
    mode: str, timings: LeaseTimings, connect_s: float, paced_s: float, expected: float
) -> None:
    assert takeover_bound_s(mode, timings, connect_s, paced_s) == pytest.approx(expected)
