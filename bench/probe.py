"""What the P5/P6 benchmarks read from outside the processes they measure.

- /proc: a process's CPU seconds (utime + stime) and resident set size;
- the worker's EMF lines (METRICS_SECONDS apart) in its log: messages delivered, connections held;
- the feed's session log: which connection ids are subscribed now, and when each first was;
- a concurrent `connections add`, since the fleet's own adds one id at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.supervisor.process import child_pids
from leaseworker_dev.local.fleet import TABLE
from leaseworker_dev.local.services import local_dynamodb

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
ADD_CONCURRENCY = 32


def raise_open_files(needed: int) -> int:
    """Raise RLIMIT_NOFILE's soft limit towards `needed` (children inherit it); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = max(soft, min(needed, hard) if hard != resource.RLIM_INFINITY else needed)
    if target != soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (its threads included), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # fields 14 and 15 of proc(5)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * PAGE_BYTES


def worker_child(supervisor_pid: int) -> int:
    """The worker process under `leaseworker run`'s supervisor (docs/design.md §2e), or the pid itself
    when it has no child (an unsupervised worker)."""
    children = child_pids(supervisor_pid)
    return children[0] if children else supervisor_pid


class _Tail:
    """The whole lines appended to a file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def lines(self) -> Iterator[bytes]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return
        self._offset += len(chunk)
        *whole, self._partial = (self._partial + chunk).split(b"\n")
        yield from whole


@dataclass(frozen=True)
class Flush:
    """One EMF line: at `t_ms`, `delivered` messages since the previous one; `held` connections."""

    t_ms: int
    delivered: float
    held: float


def _total(value: Any) -> float:
    """An EMF value: a number, or a list of them (Powertools writes a list for several values)."""
    if value is None:
        return 0.0
    return float(sum(value)) if isinstance(value, list) else float(value)


class MetricsLog:
    """The worker's EMF flushes, read from its log as they are appended."""

    def __init__(self, path: Path) -> None:
        self._tail = _Tail(path)
        self.flushes: list[Flush] = []

    def poll(self) -> list[Flush]:
        for line in self._tail.lines():
            if b'"_aws"' not in line:
                continue
            try:
                blob: dict[str, Any] = json.loads(line)
            except ValueError:
                continue
            held = _total(blob.get("ActiveConnections"))
            self.flushes.append(
                Flush(int(blob["_aws"]["Timestamp"]), _total(blob.get("MessagesDelivered")), held)
            )
        return self.flushes

    def delivered_between(self, start_ms: int, end_ms: int) -> tuple[float, int, int]:
        """Messages in the flushes after the first one at or after `start_ms`, up to the last at
        or before `end_ms`: (messages, first flush ms, last flush ms), exact over that span."""
        inside = [f for f in self.poll() if start_ms <= f.t_ms <= end_ms]
        if len(inside) < 2:
            return 0.0, start_ms, start_ms
        return sum(f.delivered for f in inside[1:]), inside[0].t_ms, inside[-1].t_ms


@dataclass
class FeedLog:
    """The feed's session log: open subscriptions and each id's first subscribe time."""

    path: Path
    first_subscribed_ms: dict[str, int] = field(default_factory=dict)
    subscribes: int = 0  # every subscribe: more than the ids when leases were lost and claimed again
    _open: dict[int, str] = field(default_factory=dict)
    _tail: _Tail | None = None

    def poll(self) -> int:
        """Reads what was appended; returns the subscriptions open now."""
        if self._tail is None:
            self._tail = _Tail(self.path)
        for line in self._tail.lines():
            if not line:
                continue
            event = json.loads(line)
            cid, session = event["connection_id"], event["session"]
            if event["event"] == "subscribe":
                self.subscribes += 1
                self._open[session] = cid
                self.first_subscribed_ms.setdefault(cid, event["t_ms"])
            elif event["event"] == "close":
                self._open.pop(session, None)
        return len(self._open)


async def _add_all(endpoint: str, pairs: list[tuple[str, str]]) -> None:
    gate = asyncio.Semaphore(ADD_CONCURRENCY)
    async with local_dynamodb(endpoint) as client:
        admin = LeaseTableAdmin(client, TABLE)

        async def add(cid: str, url: str) -> None:
            async with gate:
                await admin.add(cid, url)

        async with asyncio.TaskGroup() as group:
            for cid, url in pairs:
                group.create_task(add(cid, url))


def add_connections(endpoint: str, pairs: list[tuple[str, str]]) -> None:
    """`connections add` for every (id, url), ADD_CONCURRENCY at a time."""
    asyncio.run(_add_all(endpoint, pairs))


async def _owners(endpoint: str) -> dict[str, str | None]:
    async with local_dynamodb(endpoint) as client:
        connections = await LeaseTableAdmin(client, TABLE).list()
    return {str(c["connection_id"]): c.get("lease_owner") for c in connections}


def owners(endpoint: str) -> dict[str, str | None]:
    """Each connection's owner (None when free), from one consistent scan."""
    return asyncio.run(_owners(endpoint))


def capacity_cli(
    argv: list[str] | None,
    *,
    prog: str,
    description: str | None,
    modes: Iterable[str],
    run: Callable[[str], dict[str, Any]],
    section: Callable[[dict[str, Any]], list[str]],
    stem: str,
    plot: str,
    plot_suffix: str,
) -> int:
    """The P5/P6 command line: run one mode, write <out>/<stem>.json and its plot, print the table."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--mode", choices=sorted(modes), default="quick")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = run(args.mode)
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
    try:
        from bench import capacity_plots
    except ImportError:  # matplotlib is a dev-only dependency
        pass
    else:
        getattr(capacity_plots, plot)(results, args.out / f"{stem}-{plot_suffix}.png")
    print("\n".join(section(results)))
    return 0
