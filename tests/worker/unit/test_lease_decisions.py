"""Lease decisions are pure functions of (record, now, me, settings): table-driven, fake clock."""

from __future__ import annotations

import random

import pytest

from leaseworker.lease.balance import PeerLoad, Share, fair_share, unowned_beyond_room, water_level
from leaseworker.lease.model import (
    ConnectionItem,
    InvalidConnectionId,
    Lease,
    LeaseState,
    MalformedItem,
    check_connection_id,
    is_expired,
    local_deadline,
    renewal_timeout,
)
from leaseworker.settings import Settings

# lease 20 s, skew 1 s, margin min(2 s, 5 s) = 2 s: a lease is locally valid 17 s after the send.
S = Settings(worker_id="me")
NOW_MS = 1_700_000_000_000


@pytest.mark.parametrize(
    ("expires_at_ms", "expired"),
    [
        (0, True),  # released or new
        (NOW_MS - 1001, True),  # older than the skew allowance
        (NOW_MS - 1000, False),  # exactly at the allowance: still live
        (NOW_MS - 1, False),  # expired by our clock, but within the skew: not yet ours to take
        (NOW_MS + 5000, False),  # live
    ],
)
def test_acquire_rule_respects_clock_skew(expires_at_ms: int, expired: bool) -> None:
    assert is_expired(expires_at_ms, NOW_MS, S) is expired


def lease(valid_until: float = 117.0, state: LeaseState = LeaseState.HELD) -> Lease:
    return Lease(
        "c1", epoch=3, owner="me", ws_url="wss://x", start_seq=-1, valid_until=valid_until, state=state
    )


@pytest.mark.parametrize(
    ("state", "now", "valid"),
    [
        (LeaseState.HELD, 100.0, True),
        (LeaseState.HELD, 116.999, True),
        (LeaseState.HELD, 117.0, False),  # the deadline itself is already too late
        (LeaseState.RELEASING, 100.0, True),  # may still hand its last batch to the sink
        (LeaseState.RELEASING, 118.0, False),
        (LeaseState.LOST, 100.0, False),
        (LeaseState.ACQUIRING, 100.0, False),
    ],
)
def test_validity_by_state_and_monotonic_time(state: LeaseState, now: float, valid: bool) -> None:
    assert lease(state=state).is_valid(now) is valid


def test_deadline_counts_from_when_the_renewal_was_sent() -> None:
    assert local_deadline(100.0, S) == pytest.approx(100.0 + 20 - 1 - 2)
    held = lease(valid_until=110.0)
    held.renewed(sent_at=105.0, settings=S)  # the reply arrived late; only the send time counts
    assert held.valid_until == pytest.approx(122.0)
    held.renewed(sent_at=101.0, settings=S)  # a slow, older renewal never shortens the deadline
    assert held.valid_until == pytest.approx(122.0)


def test_lost_and_releasing_leases_are_not_extended() -> None:
    gone = lease(state=LeaseState.LOST)
    gone.renewed(sent_at=200.0, settings=S)
    assert gone.valid_until == 117.0
    gone.lose("again")
    assert gone.state is LeaseState.LOST


def test_renewal_deadline_is_its_own_local_validity() -> None:
    """A renewal may take until the deadline its own success would set (send + validity), not
    merely the lease's current deadline: an older pipelined renewal may still move that first."""
    assert renewal_timeout(S) == pytest.approx(local_deadline(100.0, S) - 100.0)
    assert renewal_timeout(S) == pytest.approx(S.local_validity_seconds)


@pytest.mark.parametrize(
    ("state", "in_flight", "now", "awaiting"),
    [
        (LeaseState.HELD, [110.0], 116.0, False),  # still valid: nothing to await
        (LeaseState.HELD, [110.0], 118.0, True),  # past 117, a renewal sent before it is pending
        (LeaseState.RELEASING, [110.0], 118.0, True),  # its release carries the checkpoint
        (LeaseState.HELD, [], 118.0, False),  # nothing in flight: lapsed
        (LeaseState.HELD, [117.5], 118.0, False),  # sent after the deadline: does not prolong it
        (LeaseState.LOST, [110.0], 118.0, False),
    ],
)
def test_a_lease_past_its_deadline_awaits_only_renewals_sent_before_it(
    state: LeaseState, in_flight: list[float], now: float, awaiting: bool
) -> None:
    held = lease(state=state)
    held.renewals_in_flight.extend(in_flight)
    assert held.awaiting_renewal(now) is awaiting


def test_a_renewal_answering_past_the_deadline_revives_the_wait_for_later_ones() -> None:
    """Sent at 110 and 117.5 (the second while awaiting the first): once the first answers, the
    lease is valid to 127 and the second counts again, having been sent within it."""
    held = lease()
    held.renewals_in_flight.extend([110.0, 117.5])
    assert held.awaiting_renewal(118.0)
    held.renewals_in_flight.remove(110.0)
    held.renewed(sent_at=110.0, settings=S)
    assert held.is_valid(118.0)
    assert held.awaiting_renewal(127.5)  # 117.5 < 127: still awaited
    held.renewals_in_flight.clear()
    assert not held.awaiting_renewal(127.5)


def attrs(**values: object) -> dict[str, object]:
    base: dict[str, object] = {
        "connection_id": {"S": "c1"},
        "desired_state": {"S": "STARTED"},
        "ws_url": {"S": "wss://feed"},
        "last_seq": {"N": "41"},
        "lease_owner": {"S": "w2"},
        "lease_expires_at_ms": {"N": str(NOW_MS + 3000)},
        "lease_epoch": {"N": "7"},
    }
    base.update(values)
    return {k: v for k, v in base.items() if v is not None}


def test_item_decoding_and_holder() -> None:
    item = ConnectionItem.from_attributes(attrs())
    assert (item.last_seq, item.lease_epoch, item.lease_owner) == (41, 7, "w2")
    assert item.holder_at(NOW_MS, S) == "w2"
    assert item.holder_at(NOW_MS + 4001, S) is None
    fresh = ConnectionItem.from_attributes(attrs(last_seq=None, lease_owner=None, lease_epoch=None))
    assert (fresh.last_seq, fresh.lease_epoch, fresh.lease_owner) == (-1, 0, None)


@pytest.mark.parametrize(
    "broken",
    [
        {"ws_url": None},
        {"ws_url": {"N": "1"}},
        {"desired_state": {"S": "PAUSED"}},
        {"last_seq": {"S": "forty"}},
        {"lease_epoch": {"S": "x"}},
        {"connection_id": None},
    ],
)
def test_malformed_items_are_refused_with_a_reason(broken: dict[str, object]) -> None:
    with pytest.raises(MalformedItem):
        ConnectionItem.from_attributes(attrs(**broken))


@pytest.mark.parametrize("bad", ["", "has space", "x" * 129, "worker#w1", "a/b", "ü"])
def test_invalid_connection_ids(bad: str) -> None:
    with pytest.raises(InvalidConnectionId):
        check_connection_id(bad)


@pytest.mark.parametrize("good", ["a", "feed-1", "BTC:USD.spot_2", "x" * 128])
def test_valid_connection_ids(good: str) -> None:
    assert check_connection_id(good) == good


@pytest.mark.parametrize(
    ("owned", "claiming", "cap", "peers", "to_own", "expected"),
    [
        (0, 0, 1000, [], 30, Share(target=30, claim=30, shed=0)),  # alone: take everything
        (0, 0, 1000, [1000, 1000], 30, Share(target=10, claim=10, shed=0)),
        (30, 0, 1000, [1000, 1000], 30, Share(target=10, claim=0, shed=10)),  # hand back half the excess
        (11, 0, 1000, [1000, 1000], 31, Share(target=11, claim=0, shed=0)),  # ceil: the odd one fits
        (5, 3, 1000, [1000, 1000], 30, Share(target=10, claim=2, shed=0)),  # in-flight claims count
        (0, 0, 1000, [], 5000, Share(target=1000, claim=1000, shed=0)),  # MAX_CONNECTIONS caps it
        (3, 0, 1000, [1000], 0, Share(target=0, claim=0, shed=2)),
        # Capacities differ: the small worker is full and the big one takes the rest, so nothing
        # stays unowned (2 workers capped at 5 and 100 with 12 connections: 5 and 7).
        (0, 0, 100, [5], 12, Share(target=7, claim=7, shed=0)),
        (0, 0, 5, [100], 12, Share(target=5, claim=5, shed=0)),
        (0, 0, 10, [2, 3, 100], 40, Share(target=10, claim=10, shed=0)),  # level 35 for the big one
        (0, 0, 3, [3], 10, Share(target=3, claim=3, shed=0)),  # not enough room anywhere: all full
    ],
)
def test_fair_share(
    owned: int, claiming: int, cap: int, peers: list[int], to_own: int, expected: Share
) -> None:
    share = fair_share(owned=owned, claiming=claiming, my_capacity=cap, peer_capacities=peers, to_own=to_own)
    assert share == expected


@pytest.mark.parametrize("seed", range(20))
def test_water_level_leaves_nothing_unowned_while_room_exists(seed: int) -> None:
    rng = random.Random(seed)
    caps = [rng.randint(1, 50) for _ in range(rng.randint(1, 8))]
    to_own = rng.randint(0, 300)
    level = water_level(caps, to_own)
    assert sum(min(c, level) for c in caps) >= min(to_own, sum(caps))
    if 0 < to_own < sum(caps):  # the least such level: one lower would leave some unowned
        assert sum(min(c, level - 1) for c in caps) < to_own


@pytest.mark.parametrize(
    ("free", "peers", "cap", "to_own", "expected"),
    [
        (0, [(10, 100)], 100, 20, 0),  # nothing free
        # A scale-out: the newcomer (load 0, level 10) has room for the shedders' releases.
        (6, [(0, 100), (12, 100)], 100, 30, 0),
        # A takeover where every survivor shows its share: the fleet lacks owners, not room.
        (6, [(10, 100), (10, 100)], 100, 36, 6 - 2 - 2),
        (5, [(3, 3)], 100, 10, 5),  # the peer is at its MAX_CONNECTIONS: no room there
        (4, [(9, 100)], 100, 20, 3),  # one place left with the peer (level 10)
    ],
)
def test_unowned_beyond_room(
    free: int, peers: list[tuple[int, int]], cap: int, to_own: int, expected: int
) -> None:
    loads = [PeerLoad(f"p{i}", load, capacity) for i, (load, capacity) in enumerate(peers)]
    assert unowned_beyond_room(free=free, peers=loads, my_capacity=cap, to_own=to_own) == expected
