"""What the chaos runner watches while faults happen: checkpoints and owners, and worker memory.

`TableSampler` reads the whole table (a consistent scan) every SAMPLE_SECONDS on its own event
loop: each connection's owner and epoch, and its effective checkpoint, the newer of the item's
`last_seq` and its holder's batched checkpoint entry at the item's epoch (docs/design.md §2b). S3 is
judged on those readings, and on every write in the table's stream (`table_history`), which
catches a step back too short-lived for a reading. `MemorySampler` reads each worker's VmRSS from /proc.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from leaseworker.lease.checkpoint_store import entries_from
from leaseworker.lease.vocabulary import CHECKPOINT_KEY_SUFFIX, RESERVED_KEY_PREFIXES, WORKER_KEY_PREFIX
from leaseworker.supervisor.process import child_pids
from leaseworker_dev.local.fleet import TABLE, Fleet
from leaseworker_dev.local.services import local_dynamodb

SAMPLE_SECONDS: Final = 0.25
MEMORY_SAMPLE_SECONDS: Final = 2.0


@dataclass
class TableReading:
    t_ms: int
    checkpoints: dict[str, int]  # connection_id -> effective checkpoint
    owners: dict[str, tuple[str | None, int]]  # connection_id -> (owner, epoch)
    states: dict[str, str] = field(default_factory=dict)
    last_errors: dict[str, str] = field(default_factory=dict)
    # worker_id -> (hb, fenced) from its session item `worker#<id>` (docs/design.md §2.0)
    sessions: dict[str, tuple[int, bool]] = field(default_factory=dict)


def checkpoint_item_worker(key: str) -> str | None:
    """The worker whose batched checkpoint item (`worker#<id>#ckpt`) this key is, else None."""
    if key.startswith(WORKER_KEY_PREFIX) and key.endswith(CHECKPOINT_KEY_SUFFIX):
        return key[len(WORKER_KEY_PREFIX) : -len(CHECKPOINT_KEY_SUFFIX)]
    return None


def session_item_worker(key: str) -> str | None:
    """The worker whose session item (`worker#<id>`) this key is, else None."""
    if key.startswith(WORKER_KEY_PREFIX) and not key.endswith(CHECKPOINT_KEY_SUFFIX):
        return key[len(WORKER_KEY_PREFIX) :]
    return None


def effective_reading(items: list[dict[str, Any]], t_ms: int) -> TableReading:
    ckpts: dict[str, dict[str, tuple[int, int]]] = {}
    reading = TableReading(t_ms, {}, {})
    for item in items:
        key = item["connection_id"]["S"]
        worker = checkpoint_item_worker(key)
        if worker is not None:
            ckpts[worker] = entries_from(item)
        elif (holder := session_item_worker(key)) is not None:
            hb = int(item.get("hb", {}).get("N", "0"))
            reading.sessions[holder] = (hb, "fenced_by" in item)
    for item in items:
        cid = item["connection_id"]["S"]
        if cid.startswith(RESERVED_KEY_PREFIXES) or "removed_at_ms" in item:
            continue
        owner = item.get("lease_owner", {}).get("S")
        epoch = int(item.get("lease_epoch", {}).get("N", "0"))
        last_seq = int(item.get("last_seq", {}).get("N", "-1"))
        entry = ckpts.get(owner or "", {}).get(cid)
        held = entry[1] if entry is not None and entry[0] == epoch else -1
        reading.checkpoints[cid] = max(last_seq, held)
        reading.owners[cid] = (owner, epoch)
        reading.states[cid] = item.get("desired_state", {}).get("S", "")
        if "last_error" in item:
            reading.last_errors[cid] = item["last_error"]["S"]
    return reading


class TableSampler(threading.Thread):
    def __init__(self, fleet: Fleet) -> None:
        super().__init__(daemon=True, name="table-sampler")
        self.endpoint = fleet.endpoint
        self.readings: list[TableReading] = []
        self.errors: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        asyncio.run(self._sample())

    async def _sample(self) -> None:
        async with local_dynamodb(self.endpoint) as client:
            while not self.halt.is_set():
                try:
                    items: list[dict[str, Any]] = []
                    start: dict[str, Any] | None = None
                    while True:
                        kwargs: dict[str, Any] = {"TableName": TABLE, "ConsistentRead": True}
                        if start:
                            kwargs["ExclusiveStartKey"] = start
                        page = await client.scan(**kwargs)
                        items.extend(page.get("Items", []))
                        start = page.get("LastEvaluatedKey")
                        if not start:
                            break
                    self.readings.append(effective_reading(items, time.time_ns() // 1_000_000))
                except asyncio.CancelledError:
                    raise
                except Exception as error:  # a sampling gap is reported, never hidden
                    self.errors.append(f"{type(error).__name__}: {error}")
                await asyncio.sleep(SAMPLE_SECONDS)


class MemorySampler(threading.Thread):
    """VmRSS (KiB) of every live worker every MEMORY_SAMPLE_SECONDS: {worker: [(t_s, kib)]}.

    A worker is its supervisor and the worker child (docs/design.md §2e): both are summed. (Sampling
    the supervisor's pid alone read a flat 12.7 MB for 30 minutes: the soak's slope was 0 by
    construction.)"""

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(daemon=True, name="memory-sampler")
        self.fleet = fleet
        self.samples: dict[str, list[tuple[float, int]]] = {}
        self.halt = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self.halt.wait(MEMORY_SAMPLE_SECONDS):
            for name, worker in list(self.fleet.workers.items()):
                kib = tree_rss_kib(worker.pid) if worker.process.alive() else None
                if kib is not None:
                    self.samples.setdefault(name, []).append((time.monotonic() - start, kib))


def tree_rss_kib(pid: int) -> int | None:
    """VmRSS of `pid` plus its children's (the supervisor and its worker child)."""
    own = rss_kib(pid)
    if own is None:
        return None
    return own + sum(rss_kib(child) or 0 for child in child_pids(pid))


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def slope_kib_per_min(points: list[tuple[float, int]]) -> float:
    """Least-squares slope of RSS over time, KiB per minute."""
    n = len(points)
    if n < 3:
        return 0.0
    mean_t = sum(t for t, _ in points) / n
    mean_m = sum(m for _, m in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (m - mean_m) for t, m in points)
    return cov / var * 60.0
