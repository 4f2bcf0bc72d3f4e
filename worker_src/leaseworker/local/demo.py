"""The minimal local demo: a fleet comes up, shares connections, shows who owns what, goes down."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from rich.console import Console

from leaseworker.cli.connections import render_table
from leaseworker.local.fleet import FAST, Fleet


def run_demo(*, workers: int, connections: int, duration: float, root: Path | None = None) -> None:
    console = Console()
    with tempfile.TemporaryDirectory(prefix="leaseworker-demo-") as scratch:
        base = root or Path(scratch)
        console.print(
            f"[bold]starting DynamoDB Local, SQS (moto), the feed and {workers} workers[/] in {base}"
        )
        with Fleet(base, timings=FAST) as fleet:
            fleet.add_connections([f"feed-{i:02d}" for i in range(connections)])
            for _ in range(workers):
                fleet.start_worker()
            deadline = time.monotonic() + duration
            while time.monotonic() < deadline:
                time.sleep(min(3.0, max(0.0, deadline - time.monotonic())))
                console.print(render_table(fleet.list_connections()))
            console.print("[bold]stopping everything[/]")
        console.print("done: every process stopped")
