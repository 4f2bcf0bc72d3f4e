"""`leaseworker local ...`: the whole system on one machine."""

from __future__ import annotations

import click

from leaseworker.cli.main import cli


@cli.group()
def local() -> None:
    """Run the system locally: DynamoDB Local, a feed, workers."""


@local.command("up")
@click.option("--workers", default=2, show_default=True, help="Worker processes to start")
@click.option("--connections", "n_connections", default=6, show_default=True, help="Connections to add")
@click.option("--duration", default=15.0, show_default=True, help="Seconds to run before stopping")
def up(workers: int, n_connections: int, duration: float) -> None:
    """Start DynamoDB Local, a seqfeed/1 feed and workers; show who owns what; stop everything."""
    from leaseworker.local.demo import run_demo

    run_demo(workers=workers, connections=n_connections, duration=duration)
