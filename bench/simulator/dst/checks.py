"""The invariants of docs/design.md §2c, judged from outside the workers: from the sink's order of
arrival, the feeds' heads and the table's checkpoints, never from what a worker believes."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

from bench.simulator.dst.sink import Arrival


def one_deliverer(arrivals: Sequence[Arrival]) -> list[str]:
    """S1: no record of epoch e arrives after one of an epoch above e."""
    highest: dict[str, Arrival] = {}
    found = []
    for arrival in arrivals:
        top = highest.get(arrival.connection_id)
        if top is not None and arrival.epoch < top.epoch:
            found.append(
                f"S1 {arrival.connection_id}: seq {arrival.seq} of epoch {arrival.epoch}"
                f" by {arrival.worker_id} at {arrival.at:.3f} s,"
                f" after epoch {top.epoch} by {top.worker_id} at {top.at:.3f} s"
            )
        if top is None or arrival.epoch > top.epoch:
            highest[arrival.connection_id] = arrival
    return found


def delivered(arrivals: Sequence[Arrival]) -> dict[str, set[int]]:
    seqs: dict[str, set[int]] = defaultdict(set)
    for arrival in arrivals:
        seqs[arrival.connection_id].add(arrival.seq)
    return seqs


def no_loss(arrivals: Sequence[Arrival]) -> list[str]:
    """S2 (a feed that replays): every seq from 1 to the last delivered reached the sink."""
    found = []
    for cid, seqs in sorted(delivered(arrivals).items()):
        missing = set(range(1, max(seqs) + 1)) - seqs
        if missing:
            found.append(f"S2 {cid}: {len(missing)} seqs never delivered, first {min(missing)}")
    return found


def checkpoints(history: Mapping[str, Sequence[tuple[float, int]]], arrivals: Sequence[Arrival]) -> list[str]:
    """S3: a connection's recorded checkpoint never moves back, nor past what the sink accepted."""
    found = []
    accepted = {cid: max(seqs) for cid, seqs in delivered(arrivals).items()}
    for cid, samples in sorted(history.items()):
        for (_, before), (at, after) in itertools.pairwise(samples):
            if after < before:
                found.append(f"S3 {cid}: the checkpoint moved back from {before} to {after} at {at:.3f} s")
                break
        if samples and samples[-1][1] > accepted.get(cid, 0):
            found.append(f"S3 {cid}: checkpoint {samples[-1][1]} ahead of the sink's {accepted.get(cid, 0)}")
    return found


def served(arrivals: Sequence[Arrival], ids: Sequence[str], *, since: float) -> list[str]:
    """Never stranded: once the faults are over and a takeover's time has passed, every
    connection is delivered again."""
    recent = {a.connection_id for a in arrivals if a.at >= since}
    return [f"stranded {cid}: nothing delivered since {since:.1f} s" for cid in ids if cid not in recent]


def stopped(
    arrivals: Sequence[Arrival],
    stops: Sequence[tuple[str, float, float]],
    *,
    within: Callable[[float], float],
) -> list[str]:
    """An operator's stop is obeyed: nothing of a STOPPED connection arrives once the workers
    have had `within(stopped_at)` seconds to notice, until it is started again."""
    found = []
    for cid, stopped_at, started_at in stops:
        notice = within(stopped_at)
        late = [a for a in arrivals if a.connection_id == cid and stopped_at + notice <= a.at < started_at]
        if late:
            found.append(
                f"stop {cid}: seq {late[0].seq} by {late[0].worker_id} at {late[0].at:.3f} s,"
                f" stopped at {stopped_at:.3f} s"
            )
    return found
