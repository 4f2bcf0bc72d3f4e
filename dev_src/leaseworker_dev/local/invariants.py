"""docs/design.md §2c checked from the outside: from what reached the sink and the feed's session log.

Nothing here asks a worker anything. S1/S2/S3 are judged on what reached the sink and what the
table says; L1/L2 on when the upstream saw subscriptions.

S1 is judged in arrival order at one arbiter (`check_s1_arrival`): the order in which the sink
itself received the records, e.g. a Kinesis shard's order (leaseworker_dev.local.stream). A late
write carries an early `received_at_ms`, and hosts' clocks differ, so ordering by receipt time
(`check_s1`, kept for the file sink) cannot see a deposed owner's write that lands after the new
owner's. The file sink has no arbiter across workers: `read_sink_arrivals` keeps each file's own
order and merges the files by receipt time, the best order the files hold.
"""

from __future__ import annotations

import heapq
import itertools
import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Delivered:
    connection_id: str
    seq: int
    epoch: int
    worker_id: str
    received_at_ms: int


def read_sink(directory: Path) -> dict[str, list[Delivered]]:
    """Every record in every `<worker>.jsonl`, grouped by connection. A torn line is an error."""
    by_connection: dict[str, list[Delivered]] = defaultdict(list)
    for path in sorted(directory.glob("*.jsonl")):
        for item in read_sink_file(path):
            by_connection[item.connection_id].append(item)
    return dict(by_connection)


def read_sink_file(path: Path) -> list[Delivered]:
    """One worker's file sink, in line order (its writer's order). A torn line is an error."""
    items: list[Delivered] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise AssertionError(f"{path.name}:{number}: torn or invalid line: {error}") from None
        items.append(
            Delivered(
                record["connection_id"],
                int(record["seq"]),
                int(record["epoch"]),
                record["worker_id"],
                int(record["received_at_ms"]),
            )
        )
    return items


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    delivered: int = 0
    duplicates: int = 0
    missing: int = 0
    connections: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "connections": self.connections,
            "delivered": self.delivered,
            "duplicated": self.duplicates,
            "missing": self.missing,
            "violations": self.violations[:50],
        }


def check_s1(records: dict[str, list[Delivered]], report: Report) -> None:
    """One deliverer: every record of epoch e was received before any record of a higher epoch."""
    for cid, items in records.items():
        last_of: dict[int, int] = {}
        first_of: dict[int, int] = {}
        for item in items:
            last_of[item.epoch] = max(last_of.get(item.epoch, item.received_at_ms), item.received_at_ms)
            first_of[item.epoch] = min(first_of.get(item.epoch, item.received_at_ms), item.received_at_ms)
        epochs = sorted(last_of)
        for lower, higher in itertools.pairwise(epochs):
            if last_of[lower] > first_of[higher]:
                report.violations.append(
                    f"S1 {cid}: epoch {lower} delivered at {last_of[lower]} after epoch {higher} began "
                    f"at {first_of[higher]}"
                )


def check_s1_arrival(arrivals: Iterable[Delivered], report: Report) -> None:
    """One deliverer, judged at one arbiter: walking the records in the order the sink received
    them, no connection's epoch ever decreases (nothing of epoch e after anything of epoch > e)."""
    highest: dict[str, Delivered] = {}
    for position, item in enumerate(arrivals):
        best = highest.get(item.connection_id)
        if best is None or item.epoch > best.epoch:
            highest[item.connection_id] = item
        elif item.epoch < best.epoch:
            report.violations.append(
                f"S1 {item.connection_id}: epoch {item.epoch} (seq {item.seq}, {item.worker_id}) arrived"
                f" at position {position}, after epoch {best.epoch} (seq {best.seq}, {best.worker_id})"
            )


def by_connection(arrivals: Iterable[Delivered]) -> dict[str, list[Delivered]]:
    """Arrivals grouped by connection, each group in arrival order."""
    grouped: dict[str, list[Delivered]] = defaultdict(list)
    for item in arrivals:
        grouped[item.connection_id].append(item)
    return dict(grouped)


def check_arrivals(
    arrivals: Sequence[Delivered], samples: list[dict[str, int]] | None = None, *, start_seq: int = 0
) -> Report:
    """S1 in arrival order, S2 and S3 over records listed in the order one arbiter received them
    (a Kinesis stream read in shard order, or read_sink_arrivals for the file sink)."""
    report = Report()
    check_s1_arrival(arrivals, report)
    records = by_connection(arrivals)
    check_s2(records, report, start_seq=start_seq)
    check_s3(samples or [], records, report)
    return report


def read_sink_arrivals(directory: Path) -> list[Delivered]:
    """The file sink's records in the best arrival order it holds: each file (one worker, one
    writer) in its own line order, the files merged by receipt time."""
    per_connection: dict[str, list[list[Delivered]]] = defaultdict(list)
    for path in sorted(directory.glob("*.jsonl")):
        for cid, run in by_connection(read_sink_file(path)).items():
            per_connection[cid].append(run)
    # Per connection each file's run is in receipt order, so a merge keeps every file's order.
    return [
        item
        for runs in per_connection.values()
        for item in heapq.merge(*runs, key=lambda d: (d.received_at_ms, d.epoch))
    ]


def check_s2(records: dict[str, list[Delivered]], report: Report, *, start_seq: int = 0) -> None:
    """No loss: seqs cover first..last without a gap. Duplicates are counted, never a violation
    (docs/design.md §2c): a replay after a takeover repeats seqs in a new epoch, and a sink write whose
    reply was lost (a PutRecords timeout that landed) is fetched and written again in the same
    epoch: at-least-once, which the consumer filter of §5 removes."""
    for cid, items in records.items():
        seen: dict[int, int] = defaultdict(int)
        for item in items:
            seen[item.seq] += 1
        seqs = sorted(seen)
        report.delivered += len(seqs)
        report.duplicates += sum(count - 1 for count in seen.values())
        if seqs[0] != start_seq:
            report.violations.append(f"S2 {cid}: first delivered seq is {seqs[0]}, not {start_seq}")
        gaps = [s for s in range(seqs[0], seqs[-1] + 1) if s not in seen]
        report.missing += len(gaps)
        if gaps:
            report.violations.append(f"S2 {cid}: {len(gaps)} seqs missing, first {gaps[:5]}")
    report.connections = len(records)


def check_s3(samples: list[dict[str, int]], records: dict[str, list[Delivered]], report: Report) -> None:
    """Checkpoints never move backwards, and never run ahead of what the sink holds.

    `samples` are successive readings of {connection_id: last_seq}; `records` was read after
    the last sample, so the sink can only hold more than it did at any sampling time.
    """
    highest = {cid: max(item.seq for item in items) for cid, items in records.items()}
    previous: dict[str, int] = {}
    for sample in samples:
        for cid, seq in sample.items():
            if seq < previous.get(cid, -1):
                report.violations.append(f"S3 {cid}: checkpoint moved back from {previous[cid]} to {seq}")
            if seq > highest.get(cid, -1):
                report.violations.append(
                    f"S3 {cid}: checkpoint {seq} ahead of the sink ({highest.get(cid, -1)})"
                )
            previous[cid] = seq


def check_all(
    sink_dir: Path, samples: list[dict[str, int]] | None = None
) -> tuple[Report, dict[str, list[Delivered]]]:
    records = read_sink(sink_dir)
    report = Report()
    check_s1(records, report)
    check_s2(records, report)
    check_s3(samples or [], records, report)
    return report, records


def resubscribed_after(
    events: list[dict[str, Any]], connection_ids: set[str], after_ms: int, *, min_epoch: dict[str, int]
) -> dict[str, float]:
    """Seconds from `after_ms` to the first subscribe of each connection at a higher epoch."""
    found: dict[str, float] = {}
    for event in events:
        cid = event.get("connection_id")
        if (
            event.get("event") == "subscribe"
            and cid in connection_ids
            and cid not in found
            and int(event.get("t_ms", 0)) >= after_ms
            and int(event.get("epoch", -1)) > min_epoch.get(str(cid), -1)
        ):
            found[str(cid)] = (int(event["t_ms"]) - after_ms) / 1000
    return found
