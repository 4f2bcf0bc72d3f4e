"""The short chaos suite (issue 11): seeded nemeses against a real local fleet, both lease modes,
judged at one arbiter (moto Kinesis, shard order); then the negative controls, which run a prefix
of the same schedules with one safety rule switched off and must FAIL with the violation named.

Between them the two runs cover every nemesis kind (process, DynamoDB, upstream, clock). The
seeds were chosen once so that each schedule covers its kinds within 55–65 s and the faults the
controls need come early; `make chaos SEED=... MODE=...` replays any seed at any length.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Final

import pytest

from leaseworker_dev.chaos.runner import RunConfig, run
from leaseworker_dev.chaos.schedule import ALL_KINDS, Schedule, make_schedule
from leaseworker_dev.chaos.unsafe import (
    CHECKPOINT_EPOCH,
    LOST_CLAIM,
    RELEASING_ENTRY,
    SELF_FENCING,
    TAKEOVER_RESUME,
)
from leaseworker_dev.chaos.verdict import Verdict
from tests.system.procscan import MARKER_VAR

DURATION_S: Final = {"connection": 88.0, "session": 75.0}
KINDS: Final = {
    "connection": (
        "sigkill",
        "sigstop",
        "sigterm",
        "rolling_restart",
        "ddb_latency",
        "ddb_stall",
        "ddb_throttle",
        "ddb_lost_reply",
    ),
    "session": (
        "sigkill",
        "sigstop",
        "scale_out",
        "scale_in",
        "ddb_blackhole",
        "ddb_reset",
        "upstream",
        "clock",
        "ddb_lost_reply",
    ),
}
# Re-chosen when ddb_lost_reply joined both runs (issue 20): 75 s and 85 s were the shortest
# lengths at which a seed covers every kind of its run; 88 s since ddb_stall lasts two leases.
SEEDS: Final = {"connection": 2, "session": 2670}
# The negative controls: (mode, the kinds that must occur in the prefix, the row that must fail,
# a phrase one of that row's findings must hold, or "" for any).
CONTROLS: Final = {
    SELF_FENCING: ("session", ("sigstop", "ddb_blackhole"), "S1 one deliverer", ""),
    CHECKPOINT_EPOCH: ("connection", ("ddb_stall",), "S3 checkpoints", ""),
    LOST_CLAIM: ("session", ("ddb_lost_reply",), "L1 no stranding", "no subscriber for"),
    TAKEOVER_RESUME: ("session", ("sigkill",), "S3 checkpoints", "across an owner change"),
    # The proxied worker's releases are held (HOLD_RELEASES_S), so that its leases stay RELEASING
    # across checkpoint rounds; three rebalances (a scale-out, and the replacements after a kill
    # and a pause) make it shed and release, and the run goes on long enough to judge them.
    RELEASING_ENTRY: (
        "session",
        ("scale_out", "sigkill", "sigstop"),
        "S3 checkpoints",
        "dropped while the item still names",
    ),
}


# The lost-claim control loses every claim reply in its window (the seed draws 0.5-0.9): the
# nemesis aims its kill so that the proxied worker claims, and a single claim that happens to
# get its reply would otherwise leave nothing stranded to find (CI, 2026-12-06: seed 2670 passed).
CERTAIN_LOSS: Final = {LOST_CLAIM: ("ddb_lost_reply", {"claim_rate": 1.0})}


# Releases held this long by the proxy in the releasing-entry control: longer than a checkpoint
# round's period, shorter than a DynamoDB call's deadline (the release still lands).
HOLD_RELEASES_S: Final = {RELEASING_ENTRY: 2.5}


def schedule_for(mode: str) -> Schedule:
    return make_schedule(SEEDS[mode], DURATION_S[mode], mode, kinds=KINDS[mode])


def prefix_for(schedule: Schedule, needed: tuple[str, ...]) -> Schedule:
    """The shortest prefix of `schedule` that holds every `needed` kind (a long blackhole)."""
    seen: set[str] = set()
    for nemesis in schedule.nemeses:
        if nemesis.kind in needed and (nemesis.kind != "ddb_blackhole" or nemesis.params["long"]):
            seen.add(nemesis.kind)
        if seen == set(needed):
            return schedule.until(nemesis.at + nemesis.duration + nemesis.recovery)
    raise AssertionError(f"seed {schedule.seed} has no {needed} in its schedule")


@pytest.fixture
def marked(marker: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every process of the run inherits the marker, so a failed run leaks nothing."""
    monkeypatch.setenv(MARKER_VAR, marker)


def show(verdict: Verdict) -> None:
    print("\n" + verdict.table())


def test_the_two_runs_cover_every_nemesis_kind() -> None:
    covered = set().union(*(schedule_for(mode).kinds() for mode in KINDS))
    assert covered == set(ALL_KINDS)
    for mode in KINDS:
        assert schedule_for(mode).kinds() == set(KINDS[mode]), mode


@pytest.mark.usefixtures("marked")
@pytest.mark.parametrize("mode", ["connection", "session"])
def test_chaos_short(tmp_path: Path, mode: str) -> None:
    verdict = run(RunConfig(schedule_for(mode), tmp_path))
    show(verdict)
    assert verdict.ok, verdict.failed()
    assert verdict.counts["missing"] == 0 and verdict.counts["stale"] == 0
    assert verdict.counts["delivered"] > 0
    assert verdict.counts["stranded"] == 0


@pytest.mark.usefixtures("marked")
@pytest.mark.parametrize("switch", sorted(CONTROLS))
def test_negative_control_fails_with_the_violation_named(tmp_path: Path, switch: str) -> None:
    mode, needed, expected, phrase = CONTROLS[switch]
    schedule = prefix_for(schedule_for(mode), needed)
    if switch in CERTAIN_LOSS:
        kind, params = CERTAIN_LOSS[switch]
        schedule = replace(
            schedule,
            nemeses=tuple(
                replace(n, params={**n.params, **params}) if n.kind == kind else n for n in schedule.nemeses
            ),
        )
    hold = HOLD_RELEASES_S.get(switch, 0.0)
    verdict = run(RunConfig(schedule, tmp_path, unsafe=switch, hold_releases_s=hold))
    show(verdict)
    assert not verdict.ok, f"{switch} off, and the checker saw nothing"
    assert expected in verdict.failed(), verdict.failed()
    row = next(row for row in verdict.rows if row.name == expected)
    assert any(phrase in finding for finding in row.detail), row.detail
