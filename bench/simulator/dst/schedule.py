"""Seeded fault schedules: what happens to which worker, when, in virtual seconds."""

from __future__ import annotations

import random
from dataclasses import dataclass

KINDS = (
    "kill",
    "terminate",
    "partition",
    "lost_replies",
    "slow_replies",
    "throttle",
    "stop_start",
    "scale_out",
    "pause",
    "remove",
)


@dataclass(frozen=True, slots=True)
class Fault:
    at: float
    kind: str
    seconds: float = 0.0  # how long a partition, a pause or a window of lost replies lasts
    replace_after: float | None = None  # a killed or stopped worker's successor starts then


@dataclass(frozen=True, slots=True)
class Schedule:
    seed: int
    mode: str
    workers: int
    connections: int
    faults: tuple[Fault, ...]
    horizon: float  # faults happen before this; then the fleet settles
    clock_offsets: tuple[float, ...] = ()  # each worker slot's wall clock, within MAX_CLOCK_SKEW

    def describe(self) -> str:
        faults = ", ".join(
            f"{f.kind}@{f.at:.1f}s" + (f"/{f.seconds:.1f}s" if f.seconds else "") for f in self.faults
        )
        return (
            f"seed {self.seed} {self.mode}: {self.workers} workers, {self.connections} connections; {faults}"
        )


def schedule(seed: int, mode: str, *, lease_seconds: float, max_clock_skew_ms: int) -> Schedule:
    """`mode`: session, connection, or mixed (each worker draws one: a rolling mode change)."""
    rng = random.Random(f"schedule-{seed}-{mode}")
    horizon = 40.0
    faults = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(KINDS)
        at = rng.uniform(8.0, horizon - 5.0)
        seconds = 0.0
        if kind in ("partition", "pause"):
            seconds = rng.uniform(0.3, 2.5) * lease_seconds  # short of the lease, and well past it
        elif kind in ("lost_replies", "slow_replies", "throttle"):
            seconds = rng.uniform(2.0, 10.0)
        elif kind == "stop_start":  # an operator stops a connection, and starts it again later
            seconds = rng.uniform(1.0, 10.0)
        replace = rng.uniform(0.0, 10.0) if kind in ("kill", "terminate") and rng.random() < 0.7 else None
        faults.append(Fault(at, kind, seconds, replace))
    skew = max_clock_skew_ms / 1000 / 2  # any two clocks differ by at most MAX_CLOCK_SKEW
    return Schedule(
        seed=seed,
        mode=mode,
        workers=rng.randint(2, 4),
        connections=rng.randint(4, 16),
        faults=tuple(sorted(faults, key=lambda f: f.at)),
        horizon=horizon,
        clock_offsets=tuple(rng.uniform(-skew, skew) for _ in range(12)),
    )
