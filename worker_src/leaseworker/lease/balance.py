"""Fair share: how many connections this worker should hold, as a pure function.

Autoscaling adds tasks when the average ActiveConnections is high; that only helps if a new
task takes load. Each worker therefore aims for its level in a water-filling of the connections
to own over the live workers' capacities: ceil(connections / workers) when no MAX_CONNECTIONS
binds, and otherwise the full capacity of the small workers with the rest spread evenly over the
others. So no STARTED connection stays unowned while some live worker has room (2 workers capped
at 5 and 100 with 12 connections: targets 5 and 7). A worker claims up to its target and hands
back what it holds beyond it, gracefully (final checkpoint, SQS hint): rebalancing loses and
duplicates nothing.

"Connections to own" is the sum of the live sessions' published load plus the free connections,
never a count over every connection item (docs/design.md §2.0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PeerLoad:
    worker_id: str
    load: int  # connections it owned at its last heartbeat
    capacity: int  # its MAX_CONNECTIONS


@dataclass(frozen=True, slots=True)
class FleetView:
    peers: tuple[PeerLoad, ...]  # the other live workers (not withdrawn, not fenced)
    free: int  # STARTED connections nobody holds (new, released or expired), orphaned included
    orphaned: int = 0  # of those, the ones fenced peers still hold: a takeover in progress
    silent: int = 0  # the published load of live peers silent for a while (not in `peers`)
    unexpired: int = 0  # fenced peers' leases not expired yet: neither free nor a live load


@dataclass(frozen=True, slots=True)
class Share:
    target: int  # connections this worker should hold
    claim: int  # how many more it may claim now
    shed: int  # how many it should hand back now


def water_level(capacities: Sequence[int], to_own: int) -> int:
    """The least level L with sum(min(c, L)) >= to_own (or the largest capacity if none is)."""
    if to_own <= 0 or not capacities:
        return 0
    if sum(capacities) <= to_own:
        return max(capacities)
    low, high = math.ceil(to_own / len(capacities)), max(capacities)
    while low < high:  # sum(min(c, L)) grows with L: bisect for the least level that suffices
        middle = (low + high) // 2
        if sum(min(c, middle) for c in capacities) >= to_own:
            high = middle
        else:
            low = middle + 1
    return low


def fair_share(
    *, owned: int, claiming: int, my_capacity: int, peer_capacities: Sequence[int], to_own: int
) -> Share:
    """`peer_capacities`: the other live workers' MAX_CONNECTIONS. We count ourselves even when
    our own session item is not visible yet."""
    level = water_level([my_capacity, *peer_capacities], to_own)
    target = min(my_capacity, level)
    claim = max(0, target - owned - claiming)
    excess = owned - target
    # Shed at most half the excess per round: loads seen by peers lag by up to one reconcile
    # period, and halving converges without a herd of simultaneous hand-backs.
    shed = math.ceil(excess / 2) if excess > 0 else 0
    return Share(target=target, claim=claim, shed=shed)


def unowned_beyond_room(*, free: int, peers: Sequence[PeerLoad], my_capacity: int, to_own: int) -> int:
    """The free connections that no live peer has room for in this view (room: a published load
    below the peer's level). A worker at its share claims its part of these beyond the share, for
    the fleet then lacks owners, not room; the rest are for the peers with room. During a
    scale-out the shedders' releases are free while the newcomers have room: claiming those
    beyond one's share took them back from the newcomers (the simulator's two newcomers held
    224 and 308 of a 500 share after 150 s, and the survivors kept growing)."""
    level = water_level([my_capacity, *(peer.capacity for peer in peers)], to_own)
    room = sum(max(0, min(peer.capacity, level) - peer.load) for peer in peers)
    return max(0, free - room)


def peers_with_room(*, peers: Sequence[PeerLoad], my_capacity: int, to_own: int) -> tuple[str, ...]:
    """The live peers whose published load is below their level in this view: the ones that
    will claim free connections now (a peer at its share claims nothing more)."""
    level = water_level([my_capacity, *(peer.capacity for peer in peers)], to_own)
    return tuple(peer.worker_id for peer in peers if peer.load < min(peer.capacity, level))
