"""The designs the benchmark runs side by side, each as a real local fleet's settings.

Every period is multiplied by one scale so a run fits in minutes; rates measured in the scaled
run are converted back with the same factor (an operation every H*scale seconds is one every H
real seconds), so every reported figure is in real, unscaled units.
"""

from __future__ import annotations

from dataclasses import dataclass

from leaseworker_dev.local.fleet import Timings


@dataclass(frozen=True)
class Design:
    name: str
    lease_mode: str  # LEASE_MODE for the fleet's workers
    lease: float = 20.0
    heartbeat: float = 5.0
    reconcile: float = 5.0
    checkpoint: float = 5.0
    skew_ms: int = 1000
    sqs: bool = True  # SQS hints on handoff (docs/design.md §6)
    supervised: bool = False  # kill the worker child, which its supervisor sees (docs/design.md §2e)
    scale: float | None = None  # a fixed time scale for this design (None: the run's)
    available: bool = True
    note: str = ""

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


SEED = Design(
    "seed",
    "connection",
    reconcile=60.0,
    skew_ms=0,
    sqs=False,
    note="the seed's parameters: lease 20, heartbeat 5, reconcile 60, no skew, no hints",
)
CONNECTION = Design("connection", "connection", note="connection mode, our defaults (docs/design.md §7)")
SESSION = Design("session", "session", note="session mode, our defaults")
# Every design's `leaseworker run` is the supervisor; the others' kills are of the whole process
# group (a host-like death: the lease path). This one kills the worker child alone, an OOM-like
# death its supervisor sees (the fence path), at production timings: the fence path's delays (the
# supervisor's fence and hints, SQS, one DynamoDB round trip) do not scale with the periods.
SESSION_SUPERVISED = Design(
    "session+supervisor",
    "session",
    supervised=True,
    scale=1.0,
    note="session mode; SIGKILL of the worker child, which its supervisor sees; unscaled timings",
)

DESIGNS: tuple[Design, ...] = (SEED, CONNECTION, SESSION, SESSION_SUPERVISED)


def runnable() -> tuple[Design, ...]:
    return tuple(design for design in DESIGNS if design.available)
