"""`leaseworker local up --scenario failover`: crash, kill, pause and terminate workers; report numbers.

The same experiment as tests/system/test_failover.py, packaged for people and CI:
1. start the fleet, add the connections, start the workers, wait until every connection is owned;
2. run steadily for `duration` seconds;
3. `crash`: SIGKILL the busiest worker's child alone (an OOM-like death): its supervisor fences
   the session and hints, so peers take over at once (the fence path, docs/design.md §2e); time until
   each of its connections is subscribed again at a higher epoch (the feed's session log is the
   clock); start a replacement; run steadily;
   `kill`: SIGKILL the busiest worker's whole process group (a host-like death): the lease path;
4. `pause`: SIGSTOP the busiest worker for longer than the lease, time the takeover, SIGCONT it
   and check it delivers nothing under its old leases after waking (self-fencing); run steadily;
5. `graceful`: SIGTERM the busiest worker; it must exit 0 and its connections must be subscribed
   elsewhere within about a second (L2); start a replacement; run steadily;
6. stop everything, then judge docs/design.md §2c (S1, S2, S3 from the sink and the checkpoint samples,
   L1 and L2 from the measured times).

The summary is one JSON object; `ok` is false when any invariant broke.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leaseworker_dev.local.events import Fault, FaultKind, FleetMonitor, fault_bound_s
from leaseworker_dev.local.fleet import FAST, Fleet
from leaseworker_dev.local.invariants import check_all

Progress = Callable[[str], None]
POLL_S = 0.5
FAULT_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Step:
    name: str  # the scenario name in the summary
    kind: FaultKind


# crash takes the fence path (the supervisor saw its child die), kill the lease path (docs/design.md §2e).
STEPS = (
    Step("crash", "crash"),
    Step("kill", "kill"),
    Step("pause", "pause"),
    Step("graceful", "terminate"),
)


class ScenarioError(RuntimeError):
    """The fleet never reached the state a step needs (e.g. connections never all owned)."""


class FailoverScenario:
    def __init__(
        self,
        root: Path,
        *,
        workers: int,
        connections: int,
        duration: float,
        feed_rate: float = 20.0,
        progress: Progress = lambda _: None,
    ) -> None:
        self.root = root
        self.n_workers = workers
        self.n_connections = connections
        self.duration = duration
        self.feed_rate = feed_rate
        self.progress = progress
        self.pids: list[int] = []

    def run(self) -> dict[str, Any]:
        self.progress(
            f"starting DynamoDB Local, SQS (moto), the feed and {self.n_workers} workers in {self.root}"
        )
        fleet = Fleet(self.root, timings=FAST, feed_rate=self.feed_rate)
        with fleet:
            self._record_pids(fleet)
            monitor = FleetMonitor(fleet)
            try:
                results = self._steps(fleet, monitor)
            finally:
                self._record_pids(fleet)
                monitor.close()
                self.progress("stopping every process it started, by pid")
        return self._summary(fleet, monitor, results)

    # ------------------------------------------------------------------ the experiment

    def _steps(self, fleet: Fleet, monitor: FleetMonitor) -> list[dict[str, Any]]:
        fleet.add_connections([f"feed-{i:02d}" for i in range(self.n_connections)])
        for _ in range(self.n_workers):
            fleet.start_worker()
        self._record_pids(fleet)
        self._wait(monitor, lambda: _all_owned(monitor, _alive(fleet, set())), 30, "every connection owned")
        self.progress(f"{self.n_connections} connections owned by {self.n_workers} workers")
        self._steady(monitor)
        results = []
        paused: set[str] = set()
        for step in STEPS:
            victim = monitor.busiest(sorted(_alive(fleet, paused)))
            if victim is None:
                raise ScenarioError("no live worker left to fault")
            fault = monitor.signal(step.kind, victim)
            self.progress(f"{step.name}: {victim} held {len(fault.epochs)} connections")
            result = self._measure(step, fault, fleet, monitor, paused)
            results.append(result)
            self.progress(
                f"{step.name}: {len(fault.times_s)}/{len(fault.epochs)} {fault.measured_as}, "
                f"max {fault.max_s:.2f} s (bound {result['bound_s']:.1f} s)"
            )
            replacement = fleet.start_worker()
            self._record_pids(fleet)
            self.progress(f"started {replacement.name} as a replacement")
            self._steady(monitor)
        return results

    def _measure(
        self, step: Step, fault: Fault, fleet: Fleet, monitor: FleetMonitor, paused: set[str]
    ) -> dict[str, Any]:
        victim = fault.worker
        if step.kind == "pause":
            paused.add(victim)
        self._wait(monitor, lambda: fault.done, FAULT_TIMEOUT_S, f"{step.name}: new subscriptions", soft=True)
        bound = fault_bound_s(fleet, step.kind)
        result: dict[str, Any] = {
            "scenario": step.name,
            "worker": victim,
            "connections": len(fault.epochs),
            "times_s": dict(sorted(fault.times_s.items())),
            "max_s": round(fault.max_s, 3),
            "bound_s": round(bound, 3),
            "unmeasured": sorted(set(fault.epochs) - set(fault.times_s)),
        }
        if step.kind == "terminate":
            result["exit_code"] = fleet.wait_exit(victim, fleet.timings.shutdown_grace_seconds + 2)
        if step.kind == "pause":
            result["stale_after_wake"] = self._wake(fleet, monitor, fault)
            paused.discard(victim)
        return result

    def _wake(self, fleet: Fleet, monitor: FleetMonitor, fault: Fault) -> int:
        """SIGCONT the paused worker; count records it delivered under its old leases afterwards."""
        sink = fleet.sink_dir / f"{fault.worker}.jsonl"
        before = len(sink.read_text().splitlines()) if sink.exists() else 0
        fleet.signal(fault.worker, signal.SIGCONT)
        monitor.note(f"SIGCONT {fault.worker}: it must self-fence, not deliver")
        self._poll_for(monitor, fleet.timings.lease_seconds)
        after = sink.read_text().splitlines()[before:] if sink.exists() else []
        held = set(fault.epochs.items())
        stale = 0
        for line in after:
            record = json.loads(line)
            if (str(record["connection_id"]), int(record["epoch"])) in held:
                stale += 1
        return stale

    # ------------------------------------------------------------------ waiting

    def _steady(self, monitor: FleetMonitor) -> None:
        self._poll_for(monitor, self.duration)

    def _poll_for(self, monitor: FleetMonitor, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            monitor.poll()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(POLL_S, left))

    def _wait(
        self,
        monitor: FleetMonitor,
        done: Callable[[], bool],
        timeout: float,
        what: str,
        *,
        soft: bool = False,
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            monitor.poll()
            if done():
                return
            time.sleep(POLL_S)
        if not soft:
            raise ScenarioError(f"timed out after {timeout:.0f} s waiting for {what}")
        self.progress(f"timed out after {timeout:.0f} s waiting for {what}")

    def _record_pids(self, fleet: Fleet) -> None:
        for child in fleet.children():
            if child.pid not in self.pids:
                self.pids.append(child.pid)

    # ------------------------------------------------------------------ the verdict

    def _summary(self, fleet: Fleet, monitor: FleetMonitor, results: list[dict[str, Any]]) -> dict[str, Any]:
        report, _ = check_all(fleet.sink_dir, monitor.samples)
        invariants: dict[str, dict[str, Any]] = {}
        for name in ("S1", "S2", "S3"):
            found = [v for v in report.violations if v.startswith(name + " ")]
            invariants[name] = {"ok": not found, "violations": found[:20]}
        l1 = []
        l2 = []
        for result in results:
            late = [
                f"{cid} {seconds:.2f} s > {result['bound_s']:.1f} s"
                for cid, seconds in result["times_s"].items()
                if seconds > result["bound_s"]
            ] + [f"{cid} never subscribed again" for cid in result["unmeasured"]]
            if result["scenario"] == "graceful":
                l2 += late
                if result.get("exit_code") != 0:
                    l2.append(
                        f"{result['worker']} exited with {result.get('exit_code')} after SIGTERM, not 0"
                    )
            else:
                l1 += late
            if result.get("stale_after_wake"):
                invariants["S1"]["ok"] = False
                invariants["S1"]["violations"].append(
                    f"{result['worker']} delivered {result['stale_after_wake']} records under its old "
                    "leases after waking"
                )
        invariants["L1"] = {"ok": not l1, "violations": l1}
        invariants["L2"] = {"ok": not l2, "violations": l2}
        for result in results:
            result["ok"] = not result["unmeasured"] and result["max_s"] <= result["bound_s"]
        timings = fleet.timings
        return {
            "ok": all(check["ok"] for check in invariants.values()),
            "settings": {
                "workers": self.n_workers,
                "connections": self.n_connections,
                "feed_rate_per_connection": self.feed_rate,
                "steady_seconds": self.duration,
                "lease_seconds": timings.lease_seconds,
                "heartbeat_seconds": timings.heartbeat_seconds,
                "reconcile_seconds": timings.reconcile_seconds,
                "max_clock_skew_ms": timings.max_clock_skew_ms,
            },
            "scenarios": results,
            "totals": {
                "connections": report.connections,
                "delivered": report.delivered,
                "duplicated": report.duplicates,
                "missing": report.missing,
            },
            "invariants": invariants,
            "pids": self.pids,
            "root": str(self.root),
        }


def _alive(fleet: Fleet, paused: set[str]) -> set[str]:
    return {name for name, worker in fleet.workers.items() if worker.process.alive() and name not in paused}


def _all_owned(monitor: FleetMonitor, alive: set[str]) -> bool:
    now_ms = time.time() * 1000
    return bool(monitor.items) and all(
        item.get("lease_owner") in alive and int(item.get("lease_expires_at_ms", 0) or 0) > now_ms
        for item in monitor.items.values()
        if item.get("desired_state") == "STARTED"
    )
