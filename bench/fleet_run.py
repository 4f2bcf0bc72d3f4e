"""One design on one real local fleet: steady-state DynamoDB traffic, then kills and handoffs."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.capacity import CrossCheck
from bench.counting import CapturingProxyThread
from bench.designs import Design
from bench.failover import busiest, fault, summary
from leaseworker.lease.vocabulary import CHECKPOINT_KEY_SUFFIX, WORKER_KEY_PREFIX
from leaseworker_dev.local.fleet import TABLE, Fleet, poll_until
from leaseworker_dev.local.invariants import check_all
from leaseworker_dev.local.services import local_dynamodb


@dataclass(frozen=True)
class Config:
    name: str
    scale: float  # every period multiplied by this
    workers: int
    connections: int
    steady_seconds: float  # scaled seconds of steady state counted
    kills: int  # SIGKILLs, each of the busiest live worker, a replacement started after each
    terms: int  # SIGTERMs likewise
    feed_rate: float = 5.0
    listing_counts: tuple[int, ...] = (100, 2000)


QUICK = Config("quick", scale=0.2, workers=4, connections=60, steady_seconds=15.0, kills=2, terms=2)
FULL = Config("full", scale=0.25, workers=4, connections=80, steady_seconds=45.0, kills=3, terms=3)
TINY = Config(
    "tiny", scale=0.1, workers=2, connections=4, steady_seconds=2.0, kills=1, terms=0, listing_counts=(4, 8)
)
# The smoke test's: one worker, no faults; it only proves the code runs and the JSON has its shape.
SMOKE = Config(
    "smoke", scale=0.1, workers=1, connections=2, steady_seconds=1.0, kills=0, terms=0, listing_counts=(2, 4)
)
CONFIGS = {c.name: c for c in (QUICK, FULL, TINY, SMOKE)}


def run_design(design: Design, config: Config, *, keep: Path | None = None) -> dict[str, Any]:
    """Run `design`; with `keep`, its fleet's logs and sink stay in keep/<design>."""
    scale = design.scale or config.scale
    timings = design.timings(scale)
    bound = timings.lease_seconds + timings.reconcile_seconds + timings.max_clock_skew_ms / 1000 + 15
    with contextlib.ExitStack() as stack:
        if keep:
            root = str(keep / design.name)
        else:
            root = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"bench-{design.name}-"))
        fleet = Fleet(
            Path(root),
            timings=timings,
            feed_rate=config.feed_rate,
            with_sqs=design.sqs,
            lease_mode=design.lease_mode,
        )
        with fleet:
            assert fleet.dynamodb is not None
            with CapturingProxyThread("127.0.0.1", fleet.dynamodb.port) as proxy:
                env = {"AWS_ENDPOINT_URL_DYNAMODB": proxy.url}
                fleet.add_connections([f"b-{i:04d}" for i in range(config.connections)])
                live = {f"w{n}" for n in range(config.workers)}
                for name in sorted(live):
                    fleet.start_worker(name, extra_env=env)
                owned = poll_until(
                    lambda: all(owner in live for owner, _ in fleet.leases().values()),
                    60 + 2 * timings.reconcile_seconds,
                )
                time.sleep(2 * timings.lease_seconds)  # let balancing settle
                start = proxy.snapshot()
                time.sleep(config.steady_seconds)
                end = proxy.snapshot()
                counts = end.counts - start.counts
                prices, sessions = asyncio.run(_price(fleet.endpoint, end.samples, set(counts)))
                spread = {w: len([o for o, _ in fleet.leases().values() if o == w]) for w in sorted(live)}
                kills: list[float] = []
                terms: list[float] = []
                serial = config.workers
                for signum, times, rounds in (
                    (signal.SIGKILL, kills, config.kills),
                    (signal.SIGTERM, terms, 0 if design.supervised else config.terms),  # as session's
                ):
                    for _ in range(rounds):
                        victim = busiest(fleet, live)
                        child = design.supervised and signum == signal.SIGKILL
                        times += [t / scale for t in fault(fleet, victim, signum, bound, child=child)]
                        live.discard(victim)
                        fleet.wait_exit(victim, timeout=timings.shutdown_grace_seconds + 5)
                        replacement = f"w{serial}"
                        serial += 1
                        fleet.start_worker(replacement, extra_env=env)
                        live.add(replacement)
                        time.sleep(2 * timings.lease_seconds)
        report, _ = check_all(Path(root) / "sink")
    return {
        "design": design.name,
        "note": design.note,
        "lease_mode": design.lease_mode,
        "timings_real": {
            "lease": design.lease,
            "heartbeat": design.heartbeat,
            "reconcile": design.reconcile,
            "checkpoint": design.checkpoint,
            "skew_ms": design.skew_ms,
            "sqs_hints": design.sqs,
        },
        "scale": scale,
        "kill": "child" if design.supervised else "group",
        "all_owned_at_start": owned,
        "spread": spread,
        "window_scaled_s": config.steady_seconds,
        "kinds": {
            kind: {"count": n, "per_s_real": n / config.steady_seconds * scale, **prices.get(kind, {})}
            for kind, n in sorted(counts.items())
        },
        "read_samples": {
            k: list(v) for k, v in end.samples.items() if k in counts and not prices[k]["write"]
        },
        "session_items": sessions,
        "takeover_kill": summary(kills),
        "handoff_term": summary(terms),
        "invariants_ok": report.ok,
        "missing_seqs": report.missing,
    }


async def _price(
    endpoint: str, samples: dict[str, tuple[str, dict[str, Any]]], kinds: set[str]
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    async with local_dynamodb(endpoint) as client:
        check = CrossCheck(client, TABLE)
        prices = {kind: await check.price(*samples[kind]) for kind in sorted(kinds) if kind in samples}
        scan = await client.scan(TableName=TABLE)
    sessions = [i for i in scan["Items"] if str(i["connection_id"]["S"]).startswith(WORKER_KEY_PREFIX)]
    return prices, [s for s in sessions if not str(s["connection_id"]["S"]).endswith(CHECKPOINT_KEY_SUFFIX)]
