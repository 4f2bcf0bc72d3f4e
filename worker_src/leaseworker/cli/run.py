"""`leaseworker run`: one worker process."""

from __future__ import annotations

import click

from leaseworker.cli.errors import run_async
from leaseworker.cli.main import cli, resolve_target, target_options
from leaseworker.settings import load_settings
from leaseworker.worker.main import run_worker


@target_options
@cli.command("run", short_help="Run a worker until SIGTERM/SIGINT.")
@click.option("--sink", default=None, help="stdout | null | file:<dir> | kinesis:<stream> [env SINK]")
@click.option("--worker-id", default=None, help="Unique id of this process [env WORKER_ID]")
@click.pass_context
def run(
    ctx: click.Context, sink: str | None, worker_id: str | None, table: str | None, endpoint_url: str | None
) -> None:
    """Run a worker until SIGTERM/SIGINT, then hand its connections over and exit 0.

    All timings come from the environment (LEASE_SECONDS, HEARTBEAT_SECONDS, ...).
    """
    target = resolve_target(ctx, table, endpoint_url)
    run_async(_run(sink, worker_id), table=target.table, endpoint=target.endpoint_url)


async def _run(sink: str | None, worker_id: str | None) -> None:
    settings = load_settings(sink=sink, worker_id=worker_id)
    await run_worker(settings)
