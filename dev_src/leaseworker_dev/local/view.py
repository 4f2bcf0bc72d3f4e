"""The live view of `leaseworker local up`: workers, connections and an event log, refreshed in place.

One thread does everything: poll the fleet (table, feed log, sink files, worker logs), run the
automatic faults, redraw, then wait up to half a second for keys. Keys are read from the tty in
cbreak mode with select(), so no reader thread is needed. Ctrl-C (still SIGINT in cbreak mode),
SIGTERM and SIGHUP never raise here: `StopSignals` records them and wakes that select(), and the
loop ends at its next check, outside any DynamoDB call or frame being written; the caller tears
down after the Live display has closed. When stdout is not a terminal the view falls back to plain
lines: each event as it happens, and a one-line summary of the workers every few seconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import termios
import time
import tty
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, RenderableType
from rich.live import Live

from leaseworker_dev.local import screen
from leaseworker_dev.local.events import Fault, FaultKind, FleetMonitor
from leaseworker_dev.local.fleet import Fleet
from leaseworker_dev.local.replays import DemoFeed
from leaseworker_dev.local.stopping import StopSignals

REFRESH_S = 0.5
PLAIN_SUMMARY_S = 5.0
AUTO_FIRST_FAULT_S = 10.0
AUTO_GAP_S = 6.0
AUTO_WAIT_S = 20.0


@dataclass
class AutoFaults:
    """The demo's script: once everything is owned, one child kill and one graceful terminate.

    Each fault is followed by a replacement worker once its connections have moved. In a mixed
    fleet the kill hits the owner of the feed that cannot replay (its takeover is a gap marker),
    and the terminate the owner of a replayable one not moved yet (it resumes with none).
    """

    enabled: bool
    phase: int = 0
    at: float = 0.0
    fault: Fault | None = None
    started: float = field(default_factory=time.monotonic)


class KeyReader:
    """Single keypresses from the controlling terminal (cbreak mode), or nothing if there is none.

    Waiting for a key ends early when a stop signal arrives."""

    def __init__(self, stop: StopSignals) -> None:
        self.stop = stop
        self.fd: int | None = None
        self._saved: list[Any] | None = None

    def __enter__(self) -> KeyReader:
        if sys.stdin.isatty():
            self.fd = sys.stdin.fileno()
            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)  # keeps ISIG: Ctrl-C is still SIGINT
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None and self._saved is not None:
            with contextlib.suppress(termios.error):  # a terminal that went away has no mode to restore
                termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)

    def read(self, timeout: float) -> str:
        """Keys typed within `timeout` s. A terminal that hung up (it reads end-of-file, or EIO,
        whether or not a SIGHUP reached this process) is a stop request, like SIGHUP."""
        ready = self.stop.wait(timeout, [] if self.fd is None else [self.fd])
        if self.fd is None or self.fd not in ready:
            return ""
        try:
            data = os.read(self.fd, 64)
        except OSError:
            data = b""
        if not data:  # in cbreak mode a read after select() returns at least one byte, or hung up
            self.stop.hang_up()
        return data.decode(errors="ignore")


class LiveView:
    def __init__(
        self,
        fleet: Fleet,
        *,
        workers: int,
        connections: int,
        duration: float | None,
        auto_faults: bool,
        stop: StopSignals,
        console: Console | None = None,
    ) -> None:
        self.fleet = fleet
        self.stop = stop
        self.n_workers = workers
        self.n_connections = connections
        self.duration = duration
        self.console = console or Console()
        self.interactive = self.console.is_terminal
        self.monitor = FleetMonitor(fleet)
        self.auto = AutoFaults(auto_faults)
        self.paused: set[str] = set()
        self.started = time.monotonic()
        self.ready_at: float | None = None
        self._next_connection = connections
        self.demo_feeds: list[DemoFeed] = []
        self._printed = 0
        self._last_summary = 0.0

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        self.fleet.add_connections([f"feed-{i:02d}" for i in range(self.n_connections)])
        self.demo_feeds = self.fleet.add_demo_feeds() if self.fleet.with_replays else []
        for _ in range(self.n_workers):
            self.fleet.start_worker()
        t = self.fleet.timings
        total = self.n_connections + len(self.demo_feeds)
        self.monitor.note(
            f"{self.n_workers} workers, {total} connections; FAST timings: lease "
            f"{t.lease_seconds:g} s, heartbeat {t.heartbeat_seconds:g} s, reconcile {t.reconcile_seconds:g} s"
        )
        if self.demo_feeds:
            feeds = "; ".join(
                f"{d.connection_id} = generic/1 [{d.preset}] on the local {d.feed} replay "
                + (
                    "(replays from a cursor: a takeover loses nothing)"
                    if d.resumable
                    else "(cannot replay: every takeover is a gap marker)"
                )
                for d in self.demo_feeds
            )
            self.monitor.note(f"{self.n_connections} seqfeed/1 connections, and {feeds}")
        if self.auto.enabled:
            self.monitor.note(
                f"in {AUTO_FIRST_FAULT_S:.0f} s: one SIGKILL, then one SIGTERM, each followed by a "
                "replacement worker (--no-auto-faults to skip)",
                "auto",
            )
        with KeyReader(self.stop) as keys:
            if self.interactive:
                with Live(self.render(), console=self.console, auto_refresh=False, transient=False) as live:
                    self._loop(keys, lambda: live.update(self.render(), refresh=True))
            else:
                self._loop(keys, self._print_plain)

    def _loop(self, keys: KeyReader, show: Any) -> None:
        """Until q, a stop signal or the end of --duration; each step is bounded (the table scan by
        its deadline), so a stop request is seen within about REFRESH_S + POLL_DEADLINE_S."""
        end = None if self.duration is None else time.monotonic() + self.duration
        while not self.stop.requested and (end is None or time.monotonic() < end):
            self.monitor.poll()
            if self.stop.requested:
                return
            self._check_ready()
            self._auto_step()
            show()
            for key in keys.read(REFRESH_S):
                if self.handle_key(key) == "quit":
                    return

    def shutdown(self) -> None:
        """Stop every process the fleet started, by pid: workers first (in parallel), then services."""
        try:
            for name, worker in self.fleet.workers.items():
                if worker.process.alive():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(worker.pid, signal.SIGCONT)
                        os.kill(worker.pid, signal.SIGTERM)
                    self.paused.discard(name)
        finally:
            try:
                self.fleet.stop()
            finally:
                self.monitor.close()

    # ------------------------------------------------------------------ actions

    def alive(self) -> list[str]:
        return sorted(n for n, w in self.fleet.workers.items() if w.process.alive() and n not in self.paused)

    def target(self) -> str | None:
        return self.monitor.busiest(self.alive())

    def stop_target(self) -> str | None:
        started = [
            cid for cid, item in sorted(self.monitor.items.items()) if item.get("desired_state") == "STARTED"
        ]
        return started[0] if started else None

    def handle_key(self, key: str) -> str | None:
        key = key.lower()
        if key == "q":
            self.monitor.note("q: stopping", "note")
            return "quit"
        target = self.target()
        if key in "kht" and target:
            kinds: dict[str, FaultKind] = {"k": "crash", "h": "kill", "t": "terminate"}
            self.monitor.signal(kinds[key], target)
        elif key == "p":
            if self.paused:
                name = sorted(self.paused)[0]
                self.fleet.signal(name, signal.SIGCONT)
                self.paused.discard(name)
                self.monitor.note(
                    f"SIGCONT {name}: its old leases are past their deadline; it must self-fence"
                )
            elif target:
                self.monitor.signal("pause", target)
                self.paused.add(target)
        elif key == "a":
            worker = self.fleet.start_worker()
            self.monitor.note(f"started {worker.name} (pid {worker.pid})")
        elif key == "c":
            cid = f"feed-{self._next_connection:02d}"
            self._next_connection += 1
            self.fleet.add_connection(cid, self.fleet.url_for(cid))
            self.monitor.note(f"added {cid}; a worker takes it within one reconcile period")
        elif key == "s":
            stopping = self.stop_target()
            if stopping:
                self.fleet.stop_connection(stopping)
                self.monitor.note(
                    f"stopped {stopping}; its owner closes and releases it at the next heartbeat"
                )
        return None

    def _check_ready(self) -> None:
        if self.ready_at is not None:
            return
        items = self.monitor.items.values()
        now_ms = time.time() * 1000
        if items and all(
            item.get("lease_owner") and int(item.get("lease_expires_at_ms", 0) or 0) > now_ms
            for item in items
        ):
            self.ready_at = time.monotonic()
            self.monitor.note(
                f"all {len(items)} connections owned, {time.monotonic() - self.started:.1f} s after the "
                "workers started"
            )

    def _auto_step(self) -> None:
        auto = self.auto
        if not auto.enabled or self.ready_at is None or auto.phase >= 4:
            return
        now = time.monotonic()
        if auto.phase in (0, 2):
            if auto.phase == 0 and not auto.at:
                auto.at = self.ready_at + AUTO_FIRST_FAULT_S
            if now < auto.at:
                return
            target = self._auto_target(auto.phase)
            if target is None:
                return
            if auto.phase == 0:
                self.monitor.note(
                    f"auto 1/2: SIGKILL {target}'s worker child. Its supervisor sees the death, "
                    "fences the session and hints its connections: peers take over at once",
                    "auto",
                )
                auto.fault = self.monitor.signal("crash", target)
            else:
                self.monitor.note(
                    f"auto 2/2: SIGTERM {target}. Graceful: it releases its leases and notifies "
                    "peers over SQS, so the handoff is not a lease expiry",
                    "auto",
                )
                auto.fault = self.monitor.signal("terminate", target)
            auto.phase += 1
            auto.at = now + AUTO_WAIT_S
            return
        # phases 1 and 3: wait for the fault to be resolved, then start a replacement
        if auto.fault is not None and not auto.fault.closed and now < auto.at:
            return
        worker = self.fleet.start_worker()
        self.monitor.note(
            f"auto: started {worker.name} to replace {auto.fault.worker if auto.fault else '?'}", "auto"
        )
        auto.phase += 1
        auto.at = now + AUTO_GAP_S
        if auto.phase >= 4:
            self.monitor.note("auto faults done: now try k, p, t, a, c, s yourself", "auto")

    def _auto_target(self, phase: int) -> str | None:
        """The busiest live worker; in a mixed fleet, first the one holding the most demo feeds
        that cannot replay (phase 0), then the most that no fault has moved yet (phase 2)."""
        alive = self.alive()
        moved = {cid for fault in self.monitor.faults for cid in fault.epochs}
        wanted = [
            d.connection_id
            for d in self.demo_feeds
            if (not d.resumable if phase == 0 else d.connection_id not in moved)
        ]
        held: dict[str, int] = {}
        for cid in wanted:
            owner = self.monitor.items.get(cid, {}).get("lease_owner")
            if owner in alive:
                held[str(owner)] = held.get(str(owner), 0) + 1
        if held:
            most = max(held.values())
            return self.monitor.busiest(sorted(n for n, count in held.items() if count == most))
        return self.target()

    # ------------------------------------------------------------------ rendering

    def render(self) -> RenderableType:
        return screen.render(self)

    # ------------------------------------------------------------------ plain output

    def _print_plain(self) -> None:
        events = list(self.monitor.events)
        for event in events[self._printed :]:
            print(f"{event.stamp()}  {event.kind:<11} {event.text}", flush=True)
        self._printed = len(events)
        if self.monitor.events.maxlen and len(events) == self.monitor.events.maxlen:
            self.monitor.events.clear()
            self._printed = 0
        now = time.monotonic()
        if now - self._last_summary >= PLAIN_SUMMARY_S:
            self._last_summary = now
            parts = []
            for name, worker in self.fleet.workers.items():
                stats = self.monitor.workers.get(name)
                state = "paused" if name in self.paused else ("alive" if worker.process.alive() else "gone")
                owned, rate = (stats.owned, stats.rate) if stats else (0, 0.0)
                session = stats.session if stats else "-"
                parts.append(f"{name} {state} {owned} conn {rate:.0f} msg/s session {session}")
            print("workers: " + " | ".join(parts), flush=True)

    def fault_summary(self) -> Iterator[str]:
        for fault in self.monitor.faults:
            if fault.epochs:
                yield (
                    f"{fault.kind} {fault.worker}: {len(fault.times_s)}/{len(fault.epochs)} "
                    f"{fault.measured_as}{'' if fault.closed else ' before the end'}, max {fault.max_s:.2f} s"
                )
