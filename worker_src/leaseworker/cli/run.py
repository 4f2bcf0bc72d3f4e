"""`leaseworker run`: the supervisor (PID 1 in the container) and, as its child, the worker.

`leaseworker run` validates the settings and decides WORKER_ID here, so that a bad value still
prints one line and exits non-zero before anything is started. It then execs the small supervisor
(`python -m leaseworker.supervisor`, same pid), which runs the worker as its child:
`python -m leaseworker run --child` with WORKER_ID and SINK in its environment (docs/design.md §2e).
"""

from __future__ import annotations

import os
import sys

import click

from leaseworker.cli.errors import CliError, run_async, translate
from leaseworker.cli.main import cli, resolve_target, target_options
from leaseworker.settings import Settings, SettingsError, load_settings
from leaseworker.supervisor.main import PRELOAD_FLAG
from leaseworker.supervisor.process import EXIT_NOT_STARTED


class NotStarted(CliError):
    """One line on stderr, exit 78: the lease table cannot be used (worker/start_check.py)."""

    exit_code = EXIT_NOT_STARTED


def child_argv() -> list[str]:
    """How the supervisor starts the worker: this command again, as the hidden child entry."""
    return [sys.executable, "-m", "leaseworker", "run", "--child"]


def supervisor_argv(child: list[str]) -> list[str]:
    """The supervisor, with its fence clients loaded while the child runs: loaded lazily after a
    death, botocore's import and client set-up took 0.45-0.8 s of the fast takeover's critical
    path (kill to fence write: 450 ms idle, 600-800 ms on a busy host, against 2 ms preloaded;
    tests/system/test_supervisor.py), for 33 MB more resident memory in the supervisor (12.9 MB
    to 45.8 MB)."""
    return [sys.executable, "-m", "leaseworker.supervisor", PRELOAD_FLAG, "--", *child]


@target_options
@cli.command("run", short_help="Run a worker until SIGTERM/SIGINT.")
@click.option("--sink", default=None, help="stdout | null | file:<dir> | kinesis:<stream> [env SINK]")
@click.option("--worker-id", default=None, help="Unique id of this process [env WORKER_ID]")
@click.option("--child", is_flag=True, hidden=True, help="Run the worker itself (the supervisor's child).")
@click.pass_context
def run(
    ctx: click.Context,
    *,
    sink: str | None,
    worker_id: str | None,
    child: bool,
    table: str | None,
    endpoint_url: str | None,
) -> None:
    """Run a worker until SIGTERM/SIGINT, then hand its connections over and exit 0.

    A small supervisor runs the worker as its child process and forwards signals to it; if the
    worker dies without shutting down cleanly, the supervisor fences its session at once, so
    that peers take its connections over without waiting for the lease, and exits with the
    worker's status. All timings come from the environment (LEASE_SECONDS, HEARTBEAT_SECONDS, ...).
    """
    target = resolve_target(ctx, table, endpoint_url)
    if child:
        run_async(_run(sink, worker_id), table=target.table, endpoint=target.endpoint_url)
        return
    settings = _validated(sink, worker_id, table=target.table, endpoint=target.endpoint_url)
    # The child reads the same environment; these two are decided here, once.
    os.environ["WORKER_ID"] = settings.worker_id
    os.environ["SINK"] = settings.sink
    sys.stdout.flush()
    sys.stderr.flush()
    argv = supervisor_argv(child_argv())
    os.execv(argv[0], argv)


def _validated(sink: str | None, worker_id: str | None, *, table: str, endpoint: str | None) -> Settings:
    try:
        return load_settings(sink=sink, worker_id=worker_id)
    except SettingsError as error:
        translated = translate(error, table=table, endpoint=endpoint)
        raise (translated or error) from None


async def _run(sink: str | None, worker_id: str | None) -> None:
    settings = load_settings(sink=sink, worker_id=worker_id)
    from leaseworker.worker.main import run_worker  # the worker's stack: only in the child
    from leaseworker.worker.start_check import StartRefused

    try:
        await run_worker(settings)
    except StartRefused as refused:
        raise NotStarted(str(refused)) from None
