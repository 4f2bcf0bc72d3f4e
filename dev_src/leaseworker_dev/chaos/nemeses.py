"""Each nemesis is a real fault with a start and a stop, applied to a running local fleet.

A nemesis records what it did as `Measure`s: which connections it took from which worker, at
what wall-clock instant, which bound (L1 takeover, L2 handoff) applies, and which exit status
the victim must end with. The verdict reads those against the feed's session log afterwards.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from leaseworker_dev.chaos.schedule import ROLLING_STEP_S, Nemesis
from leaseworker_dev.chaos.throttle_proxy import FaultProxyThread, Faults
from leaseworker_dev.local.fleet import Fleet, poll_until

FAKETIME_LIBS: Final = (
    Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"),
    Path("/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"),
    Path("/usr/local/lib/faketime/libfaketime.so.1"),
)
SUCCESSOR_UP_S: Final = 10.0  # a rolling restart's successor is stopped for at most this long
PROXIED_READY_S: Final = 20.0  # ddb_lost_reply waits at most this long for the proxied worker to hold a lease
EXIT_OK: Final = 0
EXIT_FENCED: Final = 3  # leaseworker.worker.fenced.EXIT_FENCED, kept literal: no worker import here


@dataclass
class Measure:
    nemesis: str
    bound: str  # "L1" (takeover), "L1F" (fence path), "L2" (handoff) or "" (only safety applies)
    at_ms: int
    worker: str
    victims: dict[str, int]  # connection_id -> epoch it had when the fault began
    expect_exit: int | None = None
    note: str = ""


class Chaos(Protocol):
    """What a nemesis may do to the run (implemented by runner.ChaosRun)."""

    fleet: Fleet
    proxy: FaultProxyThread
    measures: list[Measure]
    log: list[dict[str, Any]]

    def victim(
        self, target: int, *, exclude_proxied: bool = False, heir: str | None = None
    ) -> str | None: ...
    def proxied(self) -> str | None: ...
    def alive(self) -> list[str]: ...
    def doom(self, worker: str) -> None: ...
    def room(self) -> int: ...
    def start_worker(self, *, proxied: bool = False, extra_env: dict[str, str] | None = None) -> str: ...
    def held_by(self, worker: str) -> dict[str, int]: ...
    def add_bad_connections(self, faults: list[str]) -> list[str]: ...
    def say(self, text: str) -> None: ...


class Base:
    def __init__(self, spec: Nemesis) -> None:
        self.spec = spec

    def ready(self, chaos: Chaos) -> None:
        """Wait, before the fault and its duration begin, for what the fault needs (nothing)."""

    def start(self, chaos: Chaos) -> None:
        raise NotImplementedError

    def stop(self, chaos: Chaos) -> None:
        """Undo the fault (nothing for an instant one)."""


def _signal(chaos: Chaos, worker: str, signum: int) -> int:
    """`signum` to the worker's whole process group, its supervisor and the worker child: a
    SIGSTOP or SIGKILL of the supervisor's pid alone would leave the child running."""
    return int(chaos.fleet.signal(worker, signum) * 1000)


def _terminate_signal(chaos: Chaos, worker: str) -> int:
    """SIGTERM to the supervisor alone, as ECS sends it to PID 1: it forwards it to the child."""
    os.kill(chaos.fleet.workers[worker].pid, signal.SIGTERM)
    return time.time_ns() // 1_000_000


class SigKill(Base):
    """SIGKILL of the whole process group (a host-like death: the lease path, L1) or of the worker
    child alone (an OOM-like death its supervisor sees: the fence path, L1F, docs/design.md §2e)."""

    def start(self, chaos: Chaos) -> None:
        worker = chaos.victim(self.spec.target)
        if worker is None:
            return
        held = chaos.held_by(worker)
        if self.spec.params.get("child"):
            at = int(chaos.fleet.signal_child(worker, signal.SIGKILL) * 1000)
            # The supervisor fences, then exits as a shell would report the child: 128 + 9.
            measure = Measure("sigkill child", "L1F", at, worker, held, expect_exit=128 + signal.SIGKILL)
        else:
            at = _signal(chaos, worker, signal.SIGKILL)
            measure = Measure("sigkill group", "L1", at, worker, held, expect_exit=-signal.SIGKILL)
        chaos.measures.append(measure)


class SigStop(Base):
    """Pause a worker past its lease, then wake it: it must deliver nothing stale, and exit 3."""

    worker: str | None = None

    def start(self, chaos: Chaos) -> None:
        self.worker = chaos.victim(self.spec.target)
        if self.worker is None:
            return
        held = chaos.held_by(self.worker)
        at = _signal(chaos, self.worker, signal.SIGSTOP)
        chaos.measures.append(Measure("sigstop", "L1", at, self.worker, held, expect_exit=EXIT_FENCED))

    def stop(self, chaos: Chaos) -> None:
        if self.worker is not None and chaos.fleet.workers[self.worker].process.alive():
            _signal(chaos, self.worker, signal.SIGCONT)


def _terminate(chaos: Chaos, worker: str, nemesis: str) -> None:
    # A graceful handoff is measured from a worker that has started (its session item written).
    # A SIGTERM within its first second, while the interpreter still imports and before any
    # handler is installed, ends it with -15 holding nothing: a start-up race, not a handoff
    # (seen once: a scale_out's worker SIGTERMed 0.86 s after its start).
    _wait_until_up(chaos, worker)
    held = chaos.held_by(worker)
    at = _terminate_signal(chaos, worker)
    chaos.measures.append(Measure(nemesis, "L2", at, worker, held, expect_exit=EXIT_OK))


class SigTerm(Base):
    def start(self, chaos: Chaos) -> None:
        worker = chaos.victim(self.spec.target)
        if worker is not None:
            _terminate(chaos, worker, "sigterm")


class RollingRestart(Base):
    """Replace every worker of the fleet, one at a time, as an ECS rolling deployment does: start
    a successor, SIGTERM the old worker once the successor is up (its session item written: the
    peers count it), wait a step. (A fixed 1 s wait SIGTERMed while the successor's interpreter
    was still starting, and its start-up CPU on the shared cores was in every handoff.)"""

    def start(self, chaos: Chaos) -> None:
        for worker in chaos.alive():
            proxied = worker == chaos.proxied()
            successor = chaos.start_worker(proxied=proxied)  # first: capacity never dips
            time.sleep(ROLLING_STEP_S / 2)
            _wait_until_up(chaos, successor)
            _terminate(chaos, worker, "rolling_restart")
            time.sleep(ROLLING_STEP_S / 2)


def _wait_until_up(chaos: Chaos, worker: str) -> None:
    def up() -> bool:
        return chaos.fleet.session(worker) is not None

    poll_until(up, SUCCESSOR_UP_S, 0.1)


class ScaleOut(Base):
    def start(self, chaos: Chaos) -> None:
        for _ in range(min(int(self.spec.params.get("add", 2)), chaos.room())):
            chaos.start_worker()


class ScaleIn(Base):
    """SIGTERM several workers at once (the newest first), keeping at least one."""

    def start(self, chaos: Chaos) -> None:
        alive = chaos.alive()
        count = min(int(self.spec.params.get("remove", 2)), len(alive) - 1)
        for worker in sorted(alive, key=lambda w: chaos.fleet.workers[w].started_at, reverse=True)[:count]:
            _terminate(chaos, worker, "scale_in")


class DynamoLatency(Base):
    def start(self, chaos: Chaos) -> None:
        params = self.spec.params
        chaos.proxy.set_faults(Faults(latency=float(params["latency_s"]), jitter=float(params["jitter_s"])))

    def stop(self, chaos: Chaos) -> None:
        chaos.proxy.set_faults(Faults())


class DynamoBlackhole(Base):
    """Partition the proxied worker from DynamoDB (its upstream sockets stay up)."""

    def start(self, chaos: Chaos) -> None:
        worker = chaos.proxied()
        if worker is None:
            return
        held = chaos.held_by(worker) if self.spec.params.get("long") else {}
        chaos.proxy.set_mode("blackhole")
        at = time.time_ns() // 1_000_000
        if held:
            chaos.doom(worker)
            chaos.measures.append(Measure("ddb_blackhole", "L1", at, worker, held, expect_exit=EXIT_FENCED))

    def stop(self, chaos: Chaos) -> None:
        chaos.proxy.set_mode("pass")


class DynamoStall(Base):
    """Hold every DynamoDB request of the proxied worker for `hold_s` (twice the lease), then send
    it on: renewals and checkpoints it sent while its lease was valid land after a takeover."""

    def start(self, chaos: Chaos) -> None:
        worker = chaos.proxied()
        if worker is None:
            return
        held = chaos.held_by(worker)
        chaos.proxy.set_faults(Faults(latency=float(self.spec.params["hold_s"])))
        at = time.time_ns() // 1_000_000
        chaos.doom(worker)
        chaos.measures.append(Measure("ddb_stall", "L1", at, worker, held, expect_exit=EXIT_FENCED))

    def stop(self, chaos: Chaos) -> None:
        chaos.proxy.set_faults(Faults())  # requests already held keep their delay


class DynamoReset(Base):
    def start(self, chaos: Chaos) -> None:
        chaos.proxy.set_mode("reset")

    def stop(self, chaos: Chaos) -> None:
        chaos.proxy.set_mode("pass")


class DynamoThrottle(Base):
    def start(self, chaos: Chaos) -> None:
        params = self.spec.params
        chaos.proxy.set_faults(Faults(throttle_rate=float(params["rate"]), throttle_code=str(params["code"])))

    def stop(self, chaos: Chaos) -> None:
        chaos.proxy.set_faults(Faults())


class DynamoLostReply(Base):
    """Replies lost after DynamoDB applied the request, on the proxied worker's path (issue 20).

    So that the window holds claims, it starts by SIGKILLing the worker child of another worker,
    the one whose death leaves the proxied worker first choice (rendezvous) for the most of its
    connections: the supervisor's confirmed fence makes the survivors, the proxied one among
    them, claim the dead worker's connections at once. A claim whose reply is lost must be read
    back and served (or released), never stranded: the verdict's stranding row judges it, not an
    L1 bound (a lost reply may cost a client deadline on top of the takeover)."""

    def ready(self, chaos: Chaos) -> None:
        """The proxied worker must be serving before the window opens: one started a few seconds
        earlier may still be booting on busy cores (14-17 s seen), and then the survivors alone
        claim, no reply is lost, and a negative control has nothing to find (CI, 2026-12-07)."""
        proxied = chaos.proxied()
        if proxied is None:
            return
        if not poll_until(lambda: bool(chaos.held_by(proxied)), PROXIED_READY_S):
            chaos.say(f"ddb_lost_reply: {proxied} held nothing after {PROXIED_READY_S:g} s; starting anyway")

    def start(self, chaos: Chaos) -> None:
        params = self.spec.params
        chaos.proxy.set_faults(
            Faults(
                lose_rate=float(params["rate"]),
                lose_claim_rate=float(params["claim_rate"]),
                lose_how=str(params["how"]),
                lose_delay=float(params["delay_s"]),
            )
        )
        proxied = chaos.proxied()
        worker = chaos.victim(self.spec.target, exclude_proxied=True, heir=proxied) if proxied else None
        if worker is None:
            return
        held = chaos.held_by(worker)
        at = int(chaos.fleet.signal_child(worker, signal.SIGKILL) * 1000)
        note = f"claimed under lost replies by {chaos.proxied()}"
        chaos.measures.append(
            Measure(
                "ddb_lost_reply sigkill child",
                "",
                at,
                worker,
                held,
                expect_exit=128 + signal.SIGKILL,
                note=note,
            )
        )

    def stop(self, chaos: Chaos) -> None:
        chaos.proxy.set_faults(Faults())  # replies already held keep their delay


class Upstream(Base):
    """Add connections whose upstream misbehaves for ever (the feed's `?mode=` catalogue): they
    must stay with one owner and show last_error (L3), and never disturb the others."""

    def start(self, chaos: Chaos) -> None:
        added = chaos.add_bad_connections(list(self.spec.params["faults"]))
        chaos.say(f"upstream: added {added}")


class ClockSkew(Base):
    """Start one more worker whose wall clock is offset (libfaketime, monotonic clock untouched)."""

    def start(self, chaos: Chaos) -> None:
        lib = next((path for path in FAKETIME_LIBS if path.exists()), None)
        if lib is None:
            chaos.say("clock: skipped, libfaketime is not installed (apt-get install faketime)")
            return
        offset = float(self.spec.params["offset_s"])
        env = {"LD_PRELOAD": str(lib), "FAKETIME": f"{offset:+.3f}", "DONT_FAKE_MONOTONIC": "1"}
        name = chaos.start_worker(extra_env=env)
        chaos.say(f"clock: {name} runs {offset:+.3f} s off")


NEMESES: Final[dict[str, type[Base]]] = {
    "sigkill": SigKill,
    "sigstop": SigStop,
    "sigterm": SigTerm,
    "rolling_restart": RollingRestart,
    "scale_out": ScaleOut,
    "scale_in": ScaleIn,
    "ddb_latency": DynamoLatency,
    "ddb_blackhole": DynamoBlackhole,
    "ddb_stall": DynamoStall,
    "ddb_reset": DynamoReset,
    "ddb_throttle": DynamoThrottle,
    "ddb_lost_reply": DynamoLostReply,
    "upstream": Upstream,
    "clock": ClockSkew,
}


def build(spec: Nemesis) -> Base:
    return NEMESES[spec.kind](spec)
