"""Who claims a dead session's connection first: rendezvous (highest-random-weight) hashing.

Every live worker ranks the same candidates for a connection the same way, without talking to
the others: the weight of (connection, worker) is a stable hash of both. The first choice claims
at once, the k-th choice after k steps of delay, so a dead worker's load spreads evenly over the
survivors (each is first choice for about 1/n of the connections) and nobody herds onto the same
item; if the first choice is itself dead or slow, the next one takes over a step later.

The hash is blake2b, never Python's `hash()`, which is salted per process (PYTHONHASHSEED) and
would give every worker a different ranking.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

_SEPARATOR = b"\x00"  # cannot occur in a connection id or a worker id


def weight(connection_id: str, worker_id: str) -> int:
    """The (connection, worker) weight: the same on every machine, in every process."""
    digest = hashlib.blake2b(connection_id.encode() + _SEPARATOR + worker_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rank(connection_id: str, live_worker_ids: Iterable[str]) -> list[str]:
    """The live workers in the order in which they should claim `connection_id`."""
    unique = set(live_worker_ids)
    # Ties in 64 bits are practically impossible; the id breaks them so the order stays total.
    return sorted(unique, key=lambda worker: (-weight(connection_id, worker), worker))


def claim_delay(connection_id: str, me: str, live_worker_ids: Iterable[str], step: float) -> float:
    """How long `me` waits before claiming: 0 as first choice, k * step as the k-th (from 0).

    `me` is ranked even if it is missing from `live_worker_ids` (its own session may not be
    listed yet): a worker always knows it is alive.
    """
    order = rank(connection_id, [*live_worker_ids, me])
    return order.index(me) * step
