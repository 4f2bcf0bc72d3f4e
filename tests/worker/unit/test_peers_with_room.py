"""Who claims free connections now (lease/balance.py `peers_with_room`): the peers below their
level in the water-filling; the acquirer ranks candidates over them (worker/acquirer.py)."""

from __future__ import annotations

import pytest

from leaseworker.lease.balance import PeerLoad, peers_with_room


@pytest.mark.parametrize(
    ("peers", "my_capacity", "to_own", "expected"),
    [
        # A cold start: nobody holds anything, everybody claims.
        ([PeerLoad("a", 0, 1117), PeerLoad("b", 0, 1117)], 1117, 3000, ("a", "b")),
        # Level 1000 of 3000 over three: "a" is at it, "b" below it.
        ([PeerLoad("a", 1000, 1117), PeerLoad("b", 400, 1117)], 1117, 3000, ("b",)),
        # A peer at its own small MAX_CONNECTIONS has no room, whatever the level.
        ([PeerLoad("small", 5, 5), PeerLoad("big", 10, 100)], 100, 60, ("big",)),
        # Nothing to own: no room anywhere.
        ([PeerLoad("a", 0, 10)], 10, 0, ()),
    ],
)
def test_peers_with_room(
    peers: list[PeerLoad], my_capacity: int, to_own: int, expected: tuple[str, ...]
) -> None:
    assert peers_with_room(peers=peers, my_capacity=my_capacity, to_own=to_own) == expected
