"""Takeover after SIGKILL and handoff after SIGTERM, per connection, on a running fleet."""

from __future__ import annotations

import math
import statistics
from typing import Any

from leaseworker_dev.local.fleet import Fleet, poll_until


def held_by(fleet: Fleet, worker: str) -> set[str]:
    return {cid for cid, (owner, _) in fleet.leases().items() if owner == worker}


def busiest(fleet: Fleet, live: set[str]) -> str:
    owners = [owner for owner, _ in fleet.leases().values() if owner in live]
    return max(sorted(live), key=owners.count)


def fault(fleet: Fleet, victim: str, signum: int, timeout: float, *, child: bool = False) -> list[float]:
    """Signal `victim`'s process group (or, with `child`, its worker child alone); seconds (scaled
    run) until each connection it held is subscribed again at a higher epoch, `inf` for any that
    was not within `timeout`."""
    before = fleet.leases()
    ids = {cid for cid, (owner, _) in before.items() if owner == victim}
    if not ids:
        return []
    send = fleet.signal_child if child else fleet.signal
    sent_ms = int(send(victim, signum) * 1000)
    found: dict[str, float] = {}

    def done() -> bool:
        nonlocal found
        found = fleet.resubscribed(ids, sent_ms, before)
        return len(found) == len(ids)

    poll_until(done, timeout, interval=0.25)
    return [found.get(cid, math.inf) for cid in sorted(ids)]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); inf stays inf."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(samples_real: list[float]) -> dict[str, Any]:
    finite = [s for s in samples_real if math.isfinite(s)]
    return {
        "n": len(samples_real),
        "missed": len(samples_real) - len(finite),
        "p50": percentile(samples_real, 50),
        "p99": percentile(samples_real, 99),
        "max": max(samples_real) if samples_real else math.nan,
        "mean": statistics.fmean(finite) if finite else math.nan,
        "samples": sorted(samples_real),
    }
