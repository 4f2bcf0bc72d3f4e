"""A seeded schedule of nemeses: the same seed, duration, mode and kinds give the same schedule.

Everything random about a chaos run is drawn here from one `random.Random(seed)`: which nemeses,
in which order, when, for how long, against which worker slot and with which parameters. The
runner only executes it, so a failing seed replays the same faults (FoundationDB-style; the
processes' own timing is of course not replayed). Nemeses run one after another, each followed
by a recovery gap, so every bound can be attributed to the fault that caused it.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from leaseworker_dev.local.fleet import FAST, Timings

# Nemesis kinds, by what they break. (Sink faults are covered by tests/worker/integration/test_late_write.py.)
PROCESS_KINDS: Final = ("sigkill", "sigstop", "sigterm", "rolling_restart", "scale_out", "scale_in")
DYNAMODB_KINDS: Final = (
    "ddb_latency",
    "ddb_stall",
    "ddb_blackhole",
    "ddb_reset",
    "ddb_throttle",
    "ddb_lost_reply",
)
UPSTREAM_KINDS: Final = ("upstream",)
CLOCK_KINDS: Final = ("clock",)
ALL_KINDS: Final = PROCESS_KINDS + DYNAMODB_KINDS + UPSTREAM_KINDS + CLOCK_KINDS
MODES: Final = ("connection", "session")
# The soak's periodic faults: none of them may take a protected (memory-measured) worker away.
SOAK_KINDS: Final = (
    "sigkill",
    "sigstop",
    "sigterm",
    "ddb_latency",
    "ddb_reset",
    "ddb_throttle",
    "ddb_blackhole",
)
SOAK_QUIET_S: Final = 45.0

# DynamoDB latencies from the issue (0.3, 0.7, 3 s), meant against the production lease of 20 s:
# applied as the same fraction of the run's lease.
PRODUCTION_LEASE_SECONDS: Final = 20.0
LATENCY_LEVELS_S: Final = (0.3, 0.7, 3.0)
UPSTREAM_FAULTS: Final = (
    "drop",
    "error",
    "close",
    "garbage",
    "gap",
    "oversized",
    "deep",
    "surrogate",
    "replay",
)
THROTTLE_CODES: Final = ("ProvisionedThroughputExceededException", "ThrottlingException")
LOST_REPLY_HOWS: Final = ("drop", "delay", "mixed")
WARMUP_S: Final = 4.0  # after the fleet is balanced, before the first fault
TAIL_S: Final = 6.0  # after the last recovery, before the verdict
ROLLING_STEP_S: Final = 2.0


@dataclass(frozen=True)
class Nemesis:
    kind: str
    at: float  # seconds after the run's start (after warm-up began)
    duration: float  # seconds the fault stays on (0: an instant fault)
    recovery: float  # seconds after it ends before the next one may start
    target: int  # a worker slot: index into the sorted live workers, modulo their number
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def ends(self) -> float:
        return self.at + self.duration


@dataclass(frozen=True)
class Schedule:
    seed: int
    mode: str
    duration: float
    nemeses: tuple[Nemesis, ...]

    def kinds(self) -> set[str]:
        return {n.kind for n in self.nemeses}

    def until(self, seconds: float) -> Schedule:
        """The same schedule cut at `seconds` (for a negative control on a prefix of a run)."""
        kept = tuple(n for n in self.nemeses if n.at + n.duration + n.recovery <= seconds)
        return Schedule(self.seed, self.mode, seconds, kept)

    def as_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def make_schedule(
    seed: int,
    duration: float,
    mode: str,
    *,
    kinds: tuple[str, ...] = ALL_KINDS,
    timings: Timings = FAST,
    quiet_s: float = 0.0,
) -> Schedule:
    """Every kind once in a seeded order first (as long as they fit), then seeded random picks;
    `quiet_s` more seconds of steady load after each recovery (the soak's spacing)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    nemeses: list[Nemesis] = []
    t = WARMUP_S
    while True:
        kind = order.pop(0) if order else rng.choice(kinds)
        nemesis = _draw(rng, kind, t, mode, timings)
        if nemesis.at + nemesis.duration + nemesis.recovery > duration - TAIL_S:
            break
        nemeses.append(nemesis)
        t = nemesis.at + nemesis.duration + nemesis.recovery + quiet_s + round(rng.uniform(0.0, 1.0), 2)
    return Schedule(seed, mode, duration, tuple(nemeses))


def _draw(rng: random.Random, kind: str, at: float, mode: str, timings: Timings) -> Nemesis:
    lease = timings.lease_seconds
    target = rng.randrange(1000)
    settle = lease + 2 * timings.heartbeat_seconds + 2.0  # a takeover, plus restoring the fleet
    params: dict[str, Any] = {}
    duration = 0.0
    recovery = 3.0
    if kind == "sigkill":
        # Child or whole group, from the drawn target's high half (no extra draw: every seed's
        # schedule stays what it was); the slot itself is target modulo the live workers.
        params["child"] = target >= 500
        recovery = settle
    elif kind == "sigstop":
        duration = round(lease * rng.uniform(1.5, 2.0), 2)
    elif kind == "sigterm":
        pass  # instant; the defaults above
    elif kind == "rolling_restart":
        duration = 3 * ROLLING_STEP_S
    elif kind == "scale_out":
        params["add"] = rng.choice((2, 3))
    elif kind == "scale_in":
        params["remove"] = 2
    elif kind == "ddb_latency":
        level = rng.choice(LATENCY_LEVELS_S)
        latency = level * lease / PRODUCTION_LEASE_SECONDS
        params = {"level_s": level, "latency_s": round(latency, 4), "jitter_s": round(latency / 2, 4)}
        duration, recovery = 4.0, 2.0
    elif kind == "ddb_blackhole":
        # Either a blip well inside the local validity (survived) or a cut past the lease.
        params["long"] = rng.random() < 0.6
        duration = round(lease * 1.6, 2) if params["long"] else round(lease * 0.2, 2)
        recovery = settle if params["long"] else 2.0
    elif kind == "ddb_stall":
        # Requests held past the lease, then delivered: the late write to DynamoDB (docs/design.md §2a).
        # For two leases: a stall of one lease was fenced or not by a coin flip (its first heartbeat
        # after the stall landed about when the peers' lease of silence ran out), and unfenced its
        # expired leases waited for a second reconcile (over-share) or for the victim itself:
        # 6.58 s against L1's 5.90 s on 2026-12-06. Two leases always fence, as the exit-3 row expects.
        duration, recovery = round(lease * 2.0, 2), settle + lease
        params["hold_s"] = round(lease * 2.0, 2)
    elif kind == "ddb_reset":
        duration, recovery = 1.0, 2.0
    elif kind == "ddb_throttle":
        params = {"rate": round(rng.uniform(0.3, 0.5), 2), "code": rng.choice(THROTTLE_CODES)}
        duration, recovery = 4.0, 2.0
    elif kind == "ddb_lost_reply":
        # Requests applied, replies lost (a reset, or a delay past the client's deadline), while
        # the proxied worker claims: the rest of a peer's connections after its death.
        params = {
            "rate": round(rng.uniform(0.0, 0.1), 2),  # any request; higher starves the claims of their reads
            "claim_rate": round(rng.uniform(0.5, 0.9), 2),
            "how": rng.choice(LOST_REPLY_HOWS),
            "delay_s": round(lease * 2.0, 2),
        }
        duration, recovery = 4.0, settle + 2 * lease
    elif kind == "upstream":
        params["faults"] = [rng.choice(UPSTREAM_FAULTS) for _ in range(2)]
        recovery = 2.0
    elif kind == "clock":
        skew_s = timings.max_clock_skew_ms / 1000
        far = mode == "session" and rng.random() < 0.5  # far beyond the skew: session mode only
        offset = rng.choice((-1, 1)) * (rng.uniform(20, 60) if far else rng.uniform(0.2, 0.8) * skew_s)
        params = {"offset_s": round(offset, 3), "beyond_skew": far}
    else:
        raise ValueError(f"unknown nemesis kind {kind!r}")
    return Nemesis(kind, round(at, 2), duration, recovery, target, params)
