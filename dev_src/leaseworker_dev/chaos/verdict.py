"""One verdict table per chaos run: S1–S3, L1–L3, the bounds, exit statuses and the counts.

S1–S3 come from leaseworker_dev.local.invariants over the records in the order the one arbiter
received them (moto Kinesis, one shard: shard order); L1/L2 from when the feed saw each victim
connection subscribed again at a higher epoch; L3 (no bounce) and churn from epoch changes
outside every fault window.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from leaseworker_dev.chaos.nemeses import EXIT_FENCED, Measure
from leaseworker_dev.chaos.observe import TableReading
from leaseworker_dev.local.invariants import Delivered, Report, check_arrivals, resubscribed_after

# Feed fault modes the worker absorbs without an error: an overlapping replay is dropped
# (docs/design.md §4.5), a lone surrogate is carried as it is.
BENIGN_FAULTS = ("-replay", "-surrogate")


@dataclass
class Row:
    name: str
    ok: bool
    figure: str
    bound: str = ""
    detail: list[str] = field(default_factory=list)


@dataclass
class Verdict:
    seed: int
    mode: str
    rows: list[Row]
    counts: dict[str, int]
    nemeses: dict[str, int]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(row.ok for row in self.rows)

    def failed(self) -> list[str]:
        return [row.name for row in self.rows if not row.ok]

    def as_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "mode": self.mode,
            "ok": self.ok,
            "failed": self.failed(),
            "rows": [
                {"name": r.name, "ok": r.ok, "figure": r.figure, "bound": r.bound, "detail": r.detail[:10]}
                for r in self.rows
            ],
            "counts": self.counts,
            "nemeses": self.nemeses,
            **self.extra,
        }

    def table(self) -> str:
        outcome = "PASS" if self.ok else "FAIL " + ",".join(self.failed())
        lines = [f"verdict seed={self.seed} mode={self.mode}: {outcome}"]
        lines.append(f"  {'check':<22} {'verdict':<7} {'figure':<34} bound")
        for row in self.rows:
            lines.append(f"  {row.name:<22} {'PASS' if row.ok else 'FAIL':<7} {row.figure:<34} {row.bound}")
            lines.extend(f"      {d}" for d in row.detail[:5])
        lines.append("  counts: " + ", ".join(f"{k}={v}" for k, v in self.counts.items()))
        lines.append("  nemeses: " + ", ".join(f"{k}={v}" for k, v in sorted(self.nemeses.items())))
        return "\n".join(lines)


@dataclass
class Evidence:
    """Everything a run observed, handed to `judge`."""

    seed: int
    mode: str
    arrivals: list[Delivered]
    readings: list[TableReading]
    events: list[dict[str, Any]]
    measures: list[Measure]
    exits: dict[str, int | None]
    windows: list[tuple[str, int, int]]  # (kind, start_ms, end_ms incl. settle)
    bad_connections: set[str]
    nemeses: dict[str, int]
    l1_bound_s: float
    l2_bound_s: float
    l1_fence_bound_s: float
    written_back: list[str] = field(default_factory=list)  # S3 from the table's stream (table_history)
    lease_s: float = 0.0  # LEASE_SECONDS: a session item whose hb has not moved for it is not live
    fenced: set[str] = field(default_factory=set)  # workers a peer fenced (table_history.fenced_by_peers)


def judge(ev: Evidence) -> Verdict:
    samples = [reading.checkpoints for reading in ev.readings]
    report = check_arrivals(ev.arrivals, samples)
    report.violations.extend(ev.written_back)  # every write, where the samples see four a second
    rows = [
        _safety_row(report, "S1 one deliverer"),
        _safety_row(report, "S2 no loss"),
        _safety_row(report, "S3 checkpoints"),
    ]
    final = ev.readings[-1] if ev.readings else None
    stopped = {cid for cid, state in (final.states if final else {}).items() if state != "STARTED"}
    rows.append(_bound_row(ev, "L1", "L1 takeover", ev.l1_bound_s, stopped))
    rows.append(_bound_row(ev, "L1F", "L1 fence takeover", ev.l1_fence_bound_s, stopped))
    rows.append(_bound_row(ev, "L2", "L2 handoff", ev.l2_bound_s, stopped))
    rows.append(_stranded_row(ev))
    rows.append(_bounce_row(ev, final))
    rows.append(_churn_row(ev))
    rows.append(_exit_row(ev))
    counts = {
        "connections": report.connections,
        "delivered": report.delivered,
        "duplicated": report.duplicates,
        "missing": report.missing,
        "stale": stale_count(ev.arrivals),
        "arrivals": len(ev.arrivals),
        "stranded": len(find_stranded(ev, ev.l1_bound_s)[0]),
    }
    return Verdict(ev.seed, ev.mode, rows, counts, ev.nemeses)


def _safety_row(report: Report, name: str) -> Row:
    prefix = name.split(maxsplit=1)[0] + " "
    found = [v for v in report.violations if v.startswith(prefix)]
    return Row(name, not found, f"{len(found)} violations", "0", found)


def stale_count(arrivals: list[Delivered]) -> int:
    """Records that arrived after a higher epoch of their connection had arrived."""
    highest: dict[str, int] = {}
    stale = 0
    for item in arrivals:
        if item.epoch < highest.get(item.connection_id, -1):
            stale += 1
        highest[item.connection_id] = max(highest.get(item.connection_id, -1), item.epoch)
    return stale


def _bound_row(ev: Evidence, bound: str, name: str, limit: float, stopped: set[str]) -> Row:
    worst = 0.0
    detail: list[str] = []
    measured = 0
    for m in (m for m in ev.measures if m.bound == bound):
        ids = set(m.victims) - stopped - ev.bad_connections
        if not ids:
            continue
        found = resubscribed_after(ev.events, ids, m.at_ms, min_epoch=m.victims)
        measured += len(found)
        for cid in sorted(ids - set(found)):
            detail.append(f"{m.nemesis} {m.worker}: {cid} never subscribed again")
        if found:
            slowest = max(found, key=lambda c: found[c])
            worst = max(worst, found[slowest])
            if found[slowest] > limit:
                detail.append(f"{m.nemesis} {m.worker}: {slowest} after {found[slowest]:.2f} s")
    return Row(name, not detail, f"worst {worst:.2f} s over {measured} moves", f"<= {limit:.2f} s", detail)


@dataclass(frozen=True)
class Stranded:
    """A STARTED connection held by a live worker at one epoch with nobody subscribed upstream."""

    connection_id: str
    owner: str
    epoch: int
    since_ms: int
    seconds: float
    to_the_end: bool  # still stranded at the last reading

    def describe(self) -> str:
        end = ", still at the end of the run" if self.to_the_end else ""
        return (
            f"{self.connection_id}: STARTED, held by live {self.owner} at epoch {self.epoch}, "
            f"no subscriber for {self.seconds:.1f} s from {self.since_ms} ms{end}"
        )


def subscriptions(events: list[dict[str, Any]]) -> dict[str, list[tuple[int, int, int]]]:
    """Per connection, (start_ms, end_ms, epoch) of every upstream session from its subscribe to
    its close (the feed's session log; a session never closed lasts for ever)."""
    opened: dict[Any, tuple[str, int, int]] = {}
    spans: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for event in events:
        kind, key = event.get("event"), event.get("session")
        if kind == "subscribe" and event.get("epoch") is not None:
            opened[key] = (str(event["connection_id"]), int(event["t_ms"]), int(event["epoch"]))
        elif kind == "close" and key in opened:
            cid, start, epoch = opened.pop(key)
            spans[cid].append((start, int(event["t_ms"]), epoch))
    for cid, start, epoch in opened.values():
        spans[cid].append((start, 2**62, epoch))
    return spans


def live_sessions(readings: list[TableReading], lease_s: float) -> list[set[str]]:
    """Per reading, the workers whose session item is not fenced and whose `hb` moved within the
    last LEASE_SECONDS on this (the observer's) clock, as a peer judges it (docs/design.md §2.0)."""
    seen: dict[str, tuple[int, int]] = {}  # worker -> (hb, first t_ms it was seen at)
    live: list[set[str]] = []
    for reading in readings:
        now: set[str] = set()
        for worker, (hb, fenced) in reading.sessions.items():
            if seen.get(worker, (None, 0))[0] != hb:
                seen[worker] = (hb, reading.t_ms)
            if not fenced and reading.t_ms - seen[worker][1] <= lease_s * 1000:
                now.add(worker)
        live.append(now)
    return live


def find_stranded(ev: Evidence, bound_s: float) -> tuple[list[Stranded], float]:
    """Each stretch longer than `bound_s` (L1) in which a connection is STARTED, held by a live
    worker at one epoch, and no upstream session is subscribed at that epoch or a higher one;
    and the longest stretch of all. Failing upstreams (`bad_connections`) back off by design."""
    spans = subscriptions(ev.events)
    live = live_sessions(ev.readings, ev.lease_s)
    runs: dict[str, tuple[str, int, int, int]] = {}  # cid -> (owner, epoch, first, last t_ms)
    found: list[Stranded] = []
    worst = 0.0

    def close(cid: str, to_the_end: bool) -> None:
        nonlocal worst
        owner, epoch, first, last = runs.pop(cid)
        seconds = (last - first) / 1000
        worst = max(worst, seconds)
        if seconds > bound_s:
            found.append(Stranded(cid, owner, epoch, first, seconds, to_the_end))

    for reading, alive in zip(ev.readings, live, strict=True):
        t = reading.t_ms
        for cid, (owner, epoch) in reading.owners.items():
            unserved = (
                cid not in ev.bad_connections
                and reading.states.get(cid) == "STARTED"
                and owner is not None
                and owner in alive
                and not any(s <= t <= e and ep >= epoch for s, e, ep in spans.get(cid, ()))
            )
            run = runs.get(cid)
            if run is not None and (not unserved or run[:2] != (owner, epoch)):
                close(cid, False)
                run = None
            if unserved and owner is not None:
                runs[cid] = (owner, epoch, run[2] if run else t, t)
        for cid in [c for c in runs if c not in reading.owners]:
            close(cid, False)
    for cid in list(runs):
        close(cid, True)
    return sorted(found, key=lambda s: (s.connection_id, s.since_ms)), worst


def _stranded_row(ev: Evidence) -> Row:
    found, worst = find_stranded(ev, ev.l1_bound_s)
    figure = f"{len(found)} stranded (longest unserved {worst:.2f} s)"
    return Row(
        "L1 no stranding", not found, figure, f"<= {ev.l1_bound_s:.2f} s", [s.describe() for s in found]
    )


def _new_epochs(events: list[dict[str, Any]]) -> dict[str, list[tuple[int, int]]]:
    """Per connection, (t_ms, epoch) of each subscribe at an epoch above every earlier one."""
    seen: dict[str, int] = {}
    changes: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for event in events:
        if event.get("event") != "subscribe" or event.get("epoch") is None:
            continue
        cid, epoch = str(event["connection_id"]), int(event["epoch"])
        if cid in seen and epoch > seen[cid]:
            changes[cid].append((int(event["t_ms"]), epoch))
        seen[cid] = max(seen.get(cid, epoch), epoch)
    return changes


def _outside_windows(ev: Evidence, t_ms: int) -> bool:
    return not any(start <= t_ms <= end for _, start, end in ev.windows)


def _bounce_row(ev: Evidence, final: TableReading | None) -> Row:
    """L3: a connection whose upstream keeps failing stays with its owner outside fault windows,
    and shows last_error."""
    detail: list[str] = []
    changes = _new_epochs(ev.events)
    for cid in sorted(ev.bad_connections):
        moves = [t for t, _ in changes.get(cid, []) if _outside_windows(ev, t)]
        if moves:
            detail.append(f"{cid}: {len(moves)} owner changes without a fleet fault")
        benign = cid.endswith(BENIGN_FAULTS)  # handled in-stream: nothing to report as an error
        if final is not None and cid in final.owners and not benign and cid not in final.last_errors:
            detail.append(f"{cid}: no last_error")
    return Row("L3 no bounce", not detail, f"{len(ev.bad_connections)} failing upstreams", "0 moves", detail)


def _churn_row(ev: Evidence) -> Row:
    changes = _new_epochs(ev.events)
    quiet = sorted(
        (t, cid)
        for cid, moves in changes.items()
        if cid not in ev.bad_connections
        for t, _ in moves
        if _outside_windows(ev, t)
    )
    detail = [f"{cid} moved at {t} ms outside every fault window" for t, cid in quiet]
    return Row("no churn without fault", not quiet, f"{len(quiet)} quiet moves", "0", detail)


def _exit_row(ev: Evidence) -> Row:
    """Each victim's exit status. Exit 3 is what a FENCED worker owes: one paused or stalled past
    its lease is fenced only if its peers saw it silent for a whole lease before it woke, which a
    pause of 1.5 leases on loaded cores may not leave them time for. Unfenced, it rightly keeps
    running (still alive: no status); whether its connections were served meanwhile is the
    stranding and takeover rows' to judge, and what it delivered, S1's."""
    detail: list[str] = []
    unfenced = 0
    for m in ev.measures:
        if m.expect_exit is None:
            continue
        got = ev.exits.get(m.worker)
        if m.expect_exit == EXIT_FENCED and got is None and m.worker not in ev.fenced:
            unfenced += 1
            continue
        if got != m.expect_exit:
            detail.append(f"{m.nemesis} {m.worker}: exit {got}, expected {m.expect_exit}")
    checked = sum(1 for m in ev.measures if m.expect_exit is not None)
    figure = f"{checked} checked" + (f", {unfenced} never fenced (still running)" if unfenced else "")
    return Row("exit statuses", not detail, figure, "0 / 3 / -9", detail)
