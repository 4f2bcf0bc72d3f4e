"""Fair share: how many connections this worker should hold, as a pure function.

Autoscaling adds tasks when the average ActiveConnections is high; that only helps if a new
task takes load. Each worker therefore aims for ceil(STARTED / live workers) (capped at
MAX_CONNECTIONS), claims up to it, and hands back what it holds beyond it. Handing back is a
graceful release (final checkpoint, SQS hint), so rebalancing loses and duplicates nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Share:
    target: int  # connections this worker should hold
    claim: int  # how many more it may claim now
    shed: int  # how many it should hand back now


def fair_share(*, owned: int, claiming: int, live_workers: int, started: int, max_connections: int) -> Share:
    workers = max(1, live_workers)  # we are live even if our presence item is not visible yet
    target = min(max_connections, math.ceil(started / workers))
    claim = max(0, target - owned - claiming)
    excess = owned - target
    # Shed at most half the excess per round: counts seen by peers lag by up to one reconcile
    # period, and halving converges without a herd of simultaneous hand-backs.
    shed = math.ceil(excess / 2) if excess > 0 else 0
    return Share(target=target, claim=claim, shed=shed)
