"""Benchmark: the seed design's parameters against ours, same code, same run, same machine.

Each design runs a real local fleet (3 workers, 60 connections at 20 msg/s, DynamoDB Local
behind a counting proxy) with every timing scaled by SCALE so the run fits in minutes:

- seed: lease 20 s, heartbeat 5 s, reconcile 60 s, no clock-skew allowance, no SQS hints
  (the article's design; its acquire condition is `lease_expires_at_ms < :now`);
- ours: lease 20 s, heartbeat 5 s, reconcile 5 s, skew 1 s, SQS hints (DESIGN.md §7 defaults).

Printed per design: DynamoDB operations per second (by kind) in steady state, the write
capacity they imply, the worst takeover after SIGKILL and the worst handoff after SIGTERM,
all converted back to real (unscaled) seconds; then ours/seed ratios.

    make bench            # or: .venv/bin/python bench/lease_bench.py [--scale 0.2]
"""

from __future__ import annotations

import argparse
import json
import signal
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leaseworker.local.fleet import Fleet, Timings, poll_until
from leaseworker.local.invariants import check_all
from leaseworker.local.proxy import ProxyThread

WORKERS = 3
CONNECTIONS = 60
STEADY_SECONDS = 10.0  # scaled seconds of steady state measured
# Write units per operation, for items under 1 KB. A renewal rewrites the by-state-expiry sort
# key, so the index pays a delete and a put on top of the item write (DESIGN.md §2a).
WCU = {
    "UpdateItem[SET lease_expires_at_ms = :expires]": 3,  # renew
    "UpdateItem[SET last_seq = :seq]": 1,  # checkpoint: no index key changes (KEYS_ONLY)
    "UpdateItem[SET lease_owner = :me]": 3,  # acquire
    "UpdateItem[SET lease_expires_at_ms = :zero]": 3,  # release
    "PutItem": 3,  # presence: item + index (expiry is the index sort key)
}


@dataclass(frozen=True)
class Design:
    name: str
    lease: float
    heartbeat: float
    reconcile: float
    checkpoint: float
    skew_ms: int
    sqs: bool

    def timings(self, scale: float) -> Timings:
        return Timings(
            lease_seconds=self.lease * scale,
            heartbeat_seconds=self.heartbeat * scale,
            reconcile_seconds=self.reconcile * scale,
            checkpoint_seconds=self.checkpoint * scale,
            max_clock_skew_ms=int(self.skew_ms * scale),
            metrics_seconds=30.0,
            shutdown_grace_seconds=10.0,
        )


SEED = Design("seed", lease=20, heartbeat=5, reconcile=60, checkpoint=5, skew_ms=0, sqs=False)
OURS = Design("ours", lease=20, heartbeat=5, reconcile=5, checkpoint=5, skew_ms=1000, sqs=True)


def fault(fleet: Fleet, victim: str, signum: int, timeout: float) -> float:
    """Signal `victim`; return the worst time (s, scaled) until its connections are subscribed again."""
    before = fleet.leases()
    ids = {cid for cid, (owner, _) in before.items() if owner == victim}
    if not ids:
        return float("nan")
    sent_ms = int(fleet.signal(victim, signum) * 1000)
    found: dict[str, float] = {}

    def done() -> bool:
        nonlocal found
        found = fleet.resubscribed(ids, sent_ms, before)
        return len(found) == len(ids)

    if not poll_until(done, timeout):
        return float("inf")
    return max(found.values())


def run(design: Design, scale: float) -> dict[str, Any]:
    timings = design.timings(scale)
    with tempfile.TemporaryDirectory(prefix=f"bench-{design.name}-") as root:
        with Fleet(Path(root), timings=timings, with_sqs=design.sqs) as fleet:
            assert fleet.dynamodb is not None
            with ProxyThread("127.0.0.1", fleet.dynamodb.port) as proxy:
                fleet.add_connections([f"b-{i:03d}" for i in range(CONNECTIONS)])
                for n in range(WORKERS):
                    fleet.start_worker(f"w{n}", extra_env={"AWS_ENDPOINT_URL_DYNAMODB": proxy.url})
                live = {f"w{n}" for n in range(WORKERS)}
                poll_until(
                    lambda: all(o in live for o, _ in fleet.leases().values()),
                    60 + 2 * timings.reconcile_seconds,
                )
                time.sleep(2 * timings.lease_seconds)  # let rebalancing settle
                start = proxy.counts()
                time.sleep(STEADY_SECONDS)
                steady = proxy.counts() - start
                bound = (
                    timings.lease_seconds + timings.reconcile_seconds + timings.max_clock_skew_ms / 1000 + 10
                )
                takeover = fault(fleet, "w0", signal.SIGKILL, bound)
                fleet.start_worker("w3", extra_env={"AWS_ENDPOINT_URL_DYNAMODB": proxy.url})
                time.sleep(2 * timings.lease_seconds)
                handoff = fault(fleet, "w1", signal.SIGTERM, bound)
        report, _ = check_all(Path(root) / "sink")
    per_second = {op: n / STEADY_SECONDS for op, n in sorted(steady.items())}
    # Rates scale with 1/timings: a run with every period x0.2 does 5x the operations per second.
    wcu = sum(WCU.get(op, 0) * rate for op, rate in per_second.items()) * scale
    return {
        "ops_per_s": per_second,
        "writes_per_s_real": sum(r for op, r in per_second.items() if op in WCU) * scale,
        "queries_per_s_real": per_second.get("Query", 0.0) * scale,
        "wcu_per_s_real": wcu,
        "wcu_per_connection_hour_real": wcu / CONNECTIONS * 3600,
        # Failover times are measured in the scaled run: lease and reconcile scale, connect does not.
        "takeover_s": takeover,
        "takeover_bound_s": bound - 10,  # L + S + R, without the connect allowance
        "handoff_s": handoff,
        "invariants_ok": float(report.ok),
        "missing": float(report.missing),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--scale", type=float, default=0.2, help="multiply every timing by this (default 0.2)"
    )
    args = parser.parse_args()
    results = {design.name: run(design, args.scale) for design in (SEED, OURS)}
    rows = [
        ("writes/s (real)", "writes_per_s_real"),
        ("queries/s (real)", "queries_per_s_real"),
        ("WCU/s (real)", "wcu_per_s_real"),
        ("WCU per connection-hour", "wcu_per_connection_hour_real"),
        ("worst takeover after SIGKILL (s)*", "takeover_s"),
        ("  its bound L + S + R (s)*", "takeover_bound_s"),
        ("worst handoff after SIGTERM (s)*", "handoff_s"),
        ("missing seqs", "missing"),
    ]
    print(f"\n{WORKERS} workers, {CONNECTIONS} connections, {CONNECTIONS / WORKERS:.0f} per worker")
    print(f"rates converted to the real (unscaled) timings; * measured in the run scaled x{args.scale}")
    print(f"{'':34} {'seed':>10} {'ours':>10} {'ours/seed':>10}")
    for label, key in rows:
        seed, ours = results["seed"][key], results["ours"][key]
        ratio = ours / seed if seed else float("nan")
        print(f"{label:34} {seed:10.2f} {ours:10.2f} {ratio:10.2f}")
    for name, result in results.items():
        print(f"{name} ops/s (scaled): {json.dumps(result['ops_per_s'])}")
    counts = Counter({name: int(result["invariants_ok"]) for name, result in results.items()})
    print(f"invariants S1-S3 held: {dict(counts)}")


if __name__ == "__main__":
    main()
