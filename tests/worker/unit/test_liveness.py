"""Death detection on the observer's monotonic clock, table-driven on a fake clock (docs/design.md §2.0)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from leaseworker.lease.balance import FleetView
from leaseworker.lease.liveness import (
    CONFIRMED,
    SILENT_AFTER_HEARTBEATS,
    SUSPECTED,
    Listing,
    Observer,
    PeerState,
    SessionInfo,
    SessionValidity,
    claimable_kind,
    live_worker_ids,
    read_listing,
    session_deadline,
    silent_after,
)
from leaseworker.lease.rebalance import SharePlan, plan_share
from leaseworker.settings import Settings

LEASE = 10.0
ME = "me"
LIVE, DEAD, FENCED, GONE, WITHDRAWN = (
    PeerState.LIVE,
    PeerState.DEAD,
    PeerState.FENCED,
    PeerState.GONE,
    PeerState.WITHDRAWN,
)


def session(worker: str, hb: int, *, fenced: str | None = None, withdrawn: bool = False) -> SessionInfo:
    return SessionInfo(
        worker_id=worker,
        hb=hb,
        load=0,
        capacity=100,
        lease_mode="session",
        withdrawn=withdrawn,
        fenced_by="someone" if fenced else None,
        fence_kind=fenced,
    )


@dataclass(frozen=True)
class Step:
    now: float  # the observer's monotonic clock
    listed: tuple[SessionInfo, ...]
    expect: dict[str, PeerState]


CASES: dict[str, list[Step]] = {
    "first sight is never dead, however old the counter": [
        Step(1000.0, (session("a", 7),), {"a": LIVE}),
    ],
    "unchanged counter: live until LEASE_SECONDS after first sight, then dead": [
        Step(0.0, (session("a", 7),), {"a": LIVE}),
        Step(LEASE - 0.001, (session("a", 7),), {"a": LIVE}),
        Step(LEASE, (session("a", 7),), {"a": DEAD}),
        Step(LEASE + 30, (session("a", 7),), {"a": DEAD}),
    ],
    "a counter that moves again restarts the wait from when the new value was seen": [
        Step(0.0, (session("a", 7),), {"a": LIVE}),
        Step(9.0, (session("a", 8),), {"a": LIVE}),
        Step(18.9, (session("a", 8),), {"a": LIVE}),
        Step(19.0, (session("a", 8),), {"a": DEAD}),
    ],
    "a peer judged dead that moves again (it was paused) is live again": [
        Step(0.0, (session("a", 7),), {"a": LIVE}),
        Step(LEASE, (session("a", 7),), {"a": DEAD}),
        Step(LEASE + 1, (session("a", 8),), {"a": LIVE}),
    ],
    "a restarted peer reusing its id counts from 1 again: a change, not a stop": [
        Step(0.0, (session("a", 500),), {"a": LIVE}),
        Step(9.0, (session("a", 1),), {"a": LIVE}),
        Step(18.0, (session("a", 1),), {"a": LIVE}),
        Step(19.0, (session("a", 1),), {"a": DEAD}),
    ],
    "a restarted peer under a new id: the old one is gone once, the new one first seen": [
        Step(0.0, (session("a", 5),), {"a": LIVE}),
        Step(5.0, (session("a2", 1),), {"a": GONE, "a2": LIVE}),
        Step(6.0, (session("a2", 1),), {"a2": LIVE}),
        Step(15.0, (session("a2", 1),), {"a2": DEAD}),
    ],
    "a fenced peer is fenced, whatever its counter does": [
        Step(
            0.0,
            (session("s", 3, fenced=SUSPECTED), session("c", 4, fenced=CONFIRMED)),
            {"s": FENCED, "c": FENCED},
        ),
        Step(
            LEASE * 3,
            (session("s", 3, fenced=SUSPECTED), session("c", 4, fenced=CONFIRMED)),
            {"s": FENCED, "c": FENCED},
        ),
    ],
    "a withdrawn peer is not counted, and is judged dead once it falls silent": [
        Step(0.0, (session("a", 3, withdrawn=True),), {"a": WITHDRAWN}),
        Step(5.0, (session("a", 4, withdrawn=True),), {"a": WITHDRAWN}),
        Step(15.0, (session("a", 4, withdrawn=True),), {"a": DEAD}),
    ],
    "a peer that vanished is reported gone once, then forgotten": [
        Step(0.0, (session("a", 3), session("b", 1)), {"a": LIVE, "b": LIVE}),
        Step(1.0, (session("b", 2),), {"a": GONE, "b": LIVE}),
        Step(2.0, (session("b", 3),), {"b": LIVE}),
    ],
    "a vanished peer that comes back is first seen again": [
        Step(0.0, (session("a", 3),), {"a": LIVE}),
        Step(1.0, (), {"a": GONE}),
        Step(20.0, (session("a", 3),), {"a": LIVE}),
        Step(29.0, (session("a", 3),), {"a": LIVE}),
        Step(30.0, (session("a", 3),), {"a": DEAD}),
    ],
    "the observer never judges itself dead": [
        Step(0.0, (session(ME, 1),), {ME: LIVE}),
        Step(LEASE * 5, (session(ME, 1),), {ME: LIVE}),
    ],
}


@pytest.mark.parametrize("name", list(CASES))
def test_death_detection(name: str) -> None:
    observer = Observer(ME, LEASE)
    for step in CASES[name]:
        verdicts = observer.observe(step.listed, step.now)
        got = {v.worker_id: v.state for v in verdicts}
        assert got == step.expect, f"{name} at t={step.now}"


def test_dead_verdict_carries_the_counter_to_fence_on_and_how_long_it_stood_still() -> None:
    observer = Observer(ME, LEASE)
    observer.observe([session("a", 41)], 100.0)
    (verdict,) = observer.observe([session("a", 41)], 112.5)
    assert verdict.state is DEAD and verdict.hb == 41 and verdict.still_for == pytest.approx(12.5)


def test_live_ids_exclude_withdrawn_dead_and_fenced_peers() -> None:
    observer = Observer(ME, LEASE)
    listed = [
        session(ME, 1),
        session("live", 1),
        session("quiet", 1),
        session("leaving", 1, withdrawn=True),
        session("fenced", 1, fenced=SUSPECTED),
    ]
    observer.observe(listed, 0.0)
    listed[1] = session("live", 2)
    verdicts = observer.observe(listed, LEASE)
    assert live_worker_ids(verdicts) == ["live", ME]


@pytest.mark.parametrize(
    ("fenced", "expected"), [(SUSPECTED, SUSPECTED), (CONFIRMED, CONFIRMED), (None, None)]
)
def test_what_a_fence_makes_claimable(fenced: str | None, expected: str | None) -> None:
    (verdict,) = Observer(ME, LEASE).observe([session("a", 1, fenced=fenced)], 0.0)
    assert claimable_kind(verdict) == expected


def holder_settings() -> Settings:
    return Settings(lease_seconds=20.0, heartbeat_seconds=5.0, worker_id="w1")


def test_session_deadline_is_send_time_plus_lease_minus_margin_with_no_skew_term() -> None:
    settings = holder_settings()
    margin = settings.fence_margin_seconds
    assert margin == 2.0
    assert session_deadline(100.0, settings) == 100.0 + 20.0 - margin
    # The connection-mode deadline also subtracts MAX_CLOCK_SKEW; the session one does not.
    assert session_deadline(100.0, settings) > 100.0 + settings.local_validity_seconds


def test_holder_validity_only_moves_forward_and_a_fence_ends_it_for_good() -> None:
    validity = SessionValidity(holder_settings())
    assert not validity.is_valid(0.0)
    validity.heartbeat_succeeded(10.0)
    assert validity.is_valid(27.999) and not validity.is_valid(28.0)
    validity.heartbeat_succeeded(5.0)  # a late answer to an older heartbeat
    assert validity.valid_until == 28.0
    validity.heartbeat_succeeded(15.0)
    assert validity.valid_until == 33.0
    validity.fence()
    assert not validity.is_valid(16.0)
    validity.heartbeat_succeeded(16.0)
    assert not validity.is_valid(17.0)


def test_observer_cannot_fence_before_the_holders_deadline_passed() -> None:
    """The safety argument on one timeline: the holder sends the heartbeat that writes hb = v
    at s, the observer first sees v at t0 >= s; the observer may fence at t0 + LEASE, by which
    time the holder stopped delivering at least `margin` earlier."""
    settings = holder_settings()
    validity = SessionValidity(settings)
    send, commit, first_seen = 50.0, 50.4, 51.0
    validity.heartbeat_succeeded(send)
    observer = Observer(ME, settings.lease_seconds)
    assert observer.observe([session("h", 9)], first_seen)[0].state is LIVE
    fence_at = first_seen + settings.lease_seconds
    assert observer.observe([session("h", 9)], fence_at - 1e-6)[0].state is LIVE
    assert observer.observe([session("h", 9)], fence_at)[0].state is DEAD
    assert commit <= first_seen
    assert not validity.is_valid(fence_at - settings.fence_margin_seconds)


def test_a_peer_silent_for_some_heartbeats_stops_counting_in_the_share_but_not_in_ranking() -> None:
    """Connection mode, three workers of 8 each; `victim` is cut off from DynamoDB: its counter
    stands still and its 8 leases expire (free), while its published load still says 8. Counted
    twice, they left each survivor a target of 11 (3 more each: 6 of the 8), the last 2 for a
    later reconcile. Once it has been silent for SILENT_AFTER_HEARTBEATS, each survivor's share
    is half of everything, and the two of them claim all 8 in one reconcile."""
    settings = Settings(lease_seconds=3.0, heartbeat_seconds=1.0, max_clock_skew_ms=200, worker_id=ME)
    quiet = silent_after(settings)
    assert quiet == SILENT_AFTER_HEARTBEATS * settings.heartbeat_seconds < settings.lease_seconds
    loaded = {w: replace(session(w, 1), lease_mode="connection", load=8) for w in ("victim", "other", ME)}
    observer = Observer(ME, settings.lease_seconds)
    observer.observe(loaded.values(), 0.0)

    def my_plan(now: float) -> tuple[SharePlan, Listing]:
        beating = {**loaded, "other": replace(loaded["other"], hb=1 + int(now * 10))}
        verdicts = observer.observe(beating.values(), now)
        listing = read_listing(verdicts, me=ME, fenced_before={}, silent_after=quiet)
        view = FleetView(peers=listing.peers, free=8)
        return plan_share(view, owned=8, claiming=0, my_capacity=100, previous_excess=0), listing

    before, listing = my_plan(quiet - 0.1)
    assert sorted(p.worker_id for p in listing.peers) == ["other", "victim"]
    assert before.target - 8 == 3 and before.unowned == 2  # 6 of the 8 claimed by the two survivors
    after, listing = my_plan(quiet)
    assert [p.worker_id for p in listing.peers] == ["other"]
    assert after.target - 8 == 4  # both survivors: 8 of the 8
    assert "victim" in listing.live  # still ranked; fenced only by the observer rule
    assert all(v.state is LIVE for v in observer.observe(loaded.values(), quiet) if v.worker_id == "victim")
