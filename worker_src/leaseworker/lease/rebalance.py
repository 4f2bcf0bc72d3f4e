"""The reconcile's decisions, as pure functions of one fleet view (docs/design.md §2.0).

The acquirer (worker/acquirer.py) decides with these; they are pure, so unit tests reach every
rule without a fleet, and the simulator runs the real acquirer that calls them:
- `plan_share`: the fair share, who else claims now, the free connections no peer has room for,
  and what to hand back (only an excess that two consecutive views agree on);
- `room`: how many more may be claimed, up to the share or up to MAX_CONNECTIONS;
- `over_share_room`: a worker at its share claims its part of the connections no peer has room
  for, once two reconciles in a row saw them (the fleet lacks owners, not room);
- `newest_settled`: which connections to hand back: the newest, none younger than a heartbeat.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from leaseworker.lease.balance import FleetView, fair_share, peers_with_room, unowned_beyond_room

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SharePlan:
    target: int  # connections this worker should hold
    unowned: int  # free connections in this view that no peer has room for
    claimers: tuple[str, ...]  # peers with room: who claims free connections now, besides us
    live_peers: int
    excess: int  # what this view alone would hand back: remembered for the next view
    shed: int  # what to hand back now: an excess the previous view saw too


def plan_share(
    view: FleetView, *, owned: int, claiming: int, my_capacity: int, previous_excess: int
) -> SharePlan:
    """`owned`: the leases we mean to keep; `previous_excess`: the last plan's `excess`.

    Peers' published loads lag by up to a heartbeat, so one view can show an excess that is not
    there (a peer's claim counted neither as its load nor as free): only what two consecutive
    views agree on is shed. And nothing is shed while free connections wait that no peer has
    room for (the fleet lacks owners, not room: a handoff in progress; found by the seeded
    fault suite, L2), nor during a takeover (it would only add to what the survivors claim).
    Free connections the peers have room for do not stop it: in a scale-out the shedders' own
    releases are always some of them (the simulator's survivors kept 573 of a 500 share for
    100 s while a few waited for the newcomers' next reconcile).
    """
    peers = view.peers
    # A silent or fenced peer's connections still need owners. A silent peer's leases are
    # counted free as they expire and until then are in its load: the larger of the two counts
    # them once (when the free ones are its own). A fenced peer's unexpired leases are in
    # neither. Left out, two survivors' shares added up to less than the fleet's connections and
    # the last of a dead peer's waited a second reconcile (L1; the simulation's kill at 3/1:
    # 4.81 s against 4.4 s).
    to_own = owned + claiming + sum(p.load for p in peers) + max(view.free, view.silent) + view.unexpired
    share = fair_share(
        owned=owned,
        claiming=claiming,
        my_capacity=my_capacity,
        peer_capacities=[peer.capacity for peer in peers],
        to_own=to_own,
    )
    unowned = unowned_beyond_room(free=view.free, peers=peers, my_capacity=my_capacity, to_own=to_own)
    excess = share.shed if unowned == 0 and view.orphaned == 0 else 0
    return SharePlan(
        target=share.target,
        unowned=unowned,
        claimers=peers_with_room(peers=peers, my_capacity=my_capacity, to_own=to_own),
        live_peers=len(peers),
        excess=excess,
        shed=min(excess, previous_excess) if excess and previous_excess else 0,
    )


def room(*, max_connections: int, target: int, owned: int, claiming: int, over_share: bool = False) -> int:
    """How many more may be claimed: up to the share, or (`over_share`) up to MAX_CONNECTIONS.
    `owned` counts every lease still ours, those being handed back included."""
    limit = max_connections if over_share else min(max_connections, target)
    return limit - owned - claiming


def over_share_room(
    *, room_now: int, room_at_most: int, unowned: int, live_peers: int, free_rounds: int
) -> int:
    """How many to claim beyond the share (0: none). Every survivor can be "full" at once, as
    each counts the others' published load, which lags their claims by up to a heartbeat (seen:
    an expired lease left 2 s longer, 5.87 s against a 5.7 s L1). So once `free_rounds` (the
    reconciles in a row before this one that saw unowned connections) is at least one, a full
    worker claims its part of them, never beyond MAX_CONNECTIONS (`room_at_most`); rebalancing
    hands any excess back gracefully."""
    if room_now > 0 or free_rounds < 1 or unowned <= 0:
        return 0
    return max(0, min(math.ceil(unowned / (live_peers + 1)), room_at_most))


def newest_settled(acquired: Sequence[tuple[float, T]], count: int, *, settled_before: float) -> list[T]:
    """The `count` most recently acquired of (acquired_at, item), none acquired after
    `settled_before`: a connection just claimed in a takeover or a handoff, possibly above the
    share, has waited for an owner once already (L2), and its excess is shed later if real."""
    older = [entry for entry in acquired if entry[0] <= settled_before]
    return [item for _, item in sorted(older, key=lambda entry: entry[0], reverse=True)[:count]]
