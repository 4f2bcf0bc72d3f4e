"""`leaseworker health`: the container health check (docs/design.md §8).

Exit 0 when the worker in this container completed a heartbeat recently and is not shutting
down; otherwise exit 1 with one line saying why. It reads the health file the worker writes
(`leaseworker.health`) and touches nothing else: no network, no AWS credentials.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import NoReturn

import click

from leaseworker.cli.main import cli
from leaseworker.health import DEFAULT_HEALTH_FILE, HEALTH_FILE_ENV, judge

EXIT_UNHEALTHY = 1


@cli.command("health", short_help="Exit 0 if this container's worker heartbeats recently (health check).")
@click.option(
    "--file",
    "path",
    envvar=HEALTH_FILE_ENV,
    default=DEFAULT_HEALTH_FILE,
    show_default=True,
    type=click.Path(path_type=Path),
    help=f"The worker's health file [env {HEALTH_FILE_ENV}]",
)
def health(path: Path) -> None:
    """Exit 0 if the worker completed a heartbeat recently and is not shutting down, else 1.

    "Recently" is within the longer of 3 heartbeats and one lease, as the worker recorded them.
    """
    try:
        content = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        _unhealthy(f"no health file at {path}: the worker has not completed a heartbeat yet")
    except OSError as error:
        _unhealthy(f"cannot read the health file {path}: {error.strerror or error}")
    ok, reason = judge(content, time.monotonic())
    if not ok:
        _unhealthy(reason)
    click.echo(f"healthy: {reason}")


def _unhealthy(reason: str) -> NoReturn:
    click.echo(f"unhealthy: {reason}", err=True)
    raise SystemExit(EXIT_UNHEALTHY)
