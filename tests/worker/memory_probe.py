"""`python -m tests.worker.memory_probe URL SECONDS SINK_DELAY`: one session in a
fresh process against URL with a sink that takes SINK_DELAY seconds per batch; prints one JSON
line with its RSS before and at peak, and the most frames websockets held for it at once.

A separate process, so that the RSS it reports belongs to this one connection alone.
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
import time
from collections.abc import Sequence

from leaseworker.lease.model import Lease
from leaseworker.observability.logging import configure_logging
from leaseworker.observability.metrics import WorkerMetrics
from leaseworker.observability.tracing import configure_tracing
from leaseworker.records import SinkRecord
from leaseworker.settings import Settings
from leaseworker.sinks.base import Validity, always_valid
from leaseworker.worker.session import ConnectionSession
from leaseworker.worker.session_deps import SessionDeps


class SlowSink:
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.delivered = 0

    async def write(self, records: Sequence[SinkRecord], *, valid: Validity = always_valid) -> None:
        await asyncio.sleep(self.delay)
        self.delivered += sum(1 for record in records if record.to_json())

    async def close(self) -> None:
        return None


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


async def probe(url: str, seconds: float, delay: float) -> dict[str, float]:
    sink = SlowSink(delay)
    lease = Lease("probe", 1, "probe-worker", url, -1, time.monotonic() + 3600)
    deps = SessionDeps(
        settings=Settings(worker_id="probe-worker"),
        sink=sink,
        metrics=WorkerMetrics(namespace="probe", stream=io.StringIO()),
        tracing=configure_tracing(None),
    )

    async def record_failure(lease: Lease, reason: str) -> bool:
        return True

    session = ConnectionSession(lease, deps, record_failure)
    baseline = rss_bytes()
    task = asyncio.create_task(session.run())
    peak_rss, peak_frames = baseline, 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ws = session.current_ws
        if ws is not None:
            peak_frames = max(peak_frames, len(ws.recv_messages.frames))
        peak_rss = max(peak_rss, rss_bytes())
        await asyncio.sleep(0.005)
    session.request_release("probe over")
    await asyncio.wait_for(task, 10)
    return {
        "baseline_mib": baseline / 2**20,
        "peak_growth_mib": (peak_rss - baseline) / 2**20,
        "peak_frames": peak_frames,
        "delivered": sink.delivered,
    }


def main(argv: list[str]) -> None:
    url, seconds, delay = argv[0], float(argv[1]), float(argv[2])
    configure_logging("ERROR")
    print(json.dumps(asyncio.run(probe(url, seconds, delay))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
