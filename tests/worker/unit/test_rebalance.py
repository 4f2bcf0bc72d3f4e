"""The reconcile's decisions (lease/rebalance.py), table-driven: the worker's acquirer and the
simulator both decide with these."""

from __future__ import annotations

import pytest

from leaseworker.lease.balance import FleetView, PeerLoad
from leaseworker.lease.rebalance import newest_settled, over_share_room, plan_share, room


def view(*loads: tuple[str, int, int], free: int = 0, orphaned: int = 0) -> FleetView:
    return FleetView(
        peers=tuple(PeerLoad(w, load, cap) for w, load, cap in loads), free=free, orphaned=orphaned
    )


def test_an_excess_is_shed_only_when_two_views_in_a_row_see_it() -> None:
    fleet = view(("b", 10, 100), ("c", 10, 100))  # 60 to own over 3: a target of 20
    first = plan_share(fleet, owned=40, claiming=0, my_capacity=100, previous_excess=0)
    assert (first.target, first.excess, first.shed) == (20, 10, 0)  # half the excess, not yet
    second = plan_share(fleet, owned=40, claiming=0, my_capacity=100, previous_excess=first.excess)
    assert second.shed == 10
    smaller = plan_share(fleet, owned=40, claiming=0, my_capacity=100, previous_excess=4)
    assert smaller.shed == 4  # only what both views agree on


@pytest.mark.parametrize(
    ("fleet", "why"),
    [
        (view(("b", 5, 5), free=10), "free connections no peer has room for: the fleet lacks owners"),
        (view(("b", 10, 100), free=5, orphaned=5), "a takeover in progress"),
    ],
)
def test_nothing_is_shed_while_connections_wait_for_an_owner(fleet: FleetView, why: str) -> None:
    plan = plan_share(fleet, owned=60, claiming=0, my_capacity=100, previous_excess=30)
    assert (plan.excess, plan.shed) == (0, 0), why


def test_free_connections_the_peers_have_room_for_do_not_stop_a_shed() -> None:
    """A scale-out: the newcomer has room for what the shedders released."""
    plan = plan_share(
        view(("new", 0, 100), free=10), owned=90, claiming=0, my_capacity=100, previous_excess=20
    )
    assert plan.unowned == 0
    assert plan.claimers == ("new",)
    assert plan.shed == 20


@pytest.mark.parametrize(
    ("target", "owned", "claiming", "over_share", "expected"),
    [(20, 15, 2, False, 3), (20, 25, 0, False, -5), (20, 25, 0, True, 75), (500, 90, 5, False, 5)],
)
def test_room(target: int, owned: int, claiming: int, over_share: bool, expected: int) -> None:
    assert (
        room(max_connections=100, target=target, owned=owned, claiming=claiming, over_share=over_share)
        == expected
    )


@pytest.mark.parametrize(
    ("room_now", "room_at_most", "unowned", "live_peers", "free_rounds", "expected"),
    [
        (0, 50, 9, 2, 1, 3),  # full, seen twice: our third of the 9 nobody has room for
        (0, 50, 9, 2, 0, 0),  # seen once: the peers' published loads may only lag
        (3, 50, 9, 2, 5, 0),  # not full: claim within the share
        (0, 2, 9, 2, 1, 2),  # never beyond MAX_CONNECTIONS
        (0, 50, 0, 2, 3, 0),  # nothing unowned
    ],
)
def test_over_share_room(
    room_now: int, room_at_most: int, unowned: int, live_peers: int, free_rounds: int, expected: int
) -> None:
    got = over_share_room(
        room_now=room_now,
        room_at_most=room_at_most,
        unowned=unowned,
        live_peers=live_peers,
        free_rounds=free_rounds,
    )
    assert got == expected


def test_the_newest_settled_connections_are_handed_back_never_one_just_claimed() -> None:
    acquired = [(1.0, "a"), (5.0, "b"), (3.0, "c"), (9.5, "just claimed"), (4.0, "d")]
    assert newest_settled(acquired, 2, settled_before=9.0) == ["b", "d"]
    assert newest_settled(acquired, 10, settled_before=2.0) == ["a"]
