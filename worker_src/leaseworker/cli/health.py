"""`leaseworker health`: the container health check (docs/design.md §8).

Exit 0 when the worker in this container completed a heartbeat recently and is not shutting
down; otherwise exit 1 with one line saying why. It reads the health file the worker writes
(`leaseworker.health`) and touches nothing else: no network, no AWS credentials.

Which worker: the one of this environment's fleet (TABLE_NAME, the DynamoDB endpoint, the
region, as `leaseworker run` reads them) and user, whose default health file is its own; never
another checkout's or fleet's worker on a shared host. `--file` (LEASEWORKER_HEALTH_FILE) names
a file instead, judged as it is.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import NoReturn

import click

from leaseworker.cli.main import cli, resolve_target, target_options
from leaseworker.health import HEALTH_FILE_ENV, default_health_file, describe_fleet, fleet_of, judge

EXIT_UNHEALTHY = 1


@target_options
@cli.command("health", short_help="Exit 0 if this container's worker heartbeats recently (health check).")
@click.option(
    "--file",
    "path",
    envvar=HEALTH_FILE_ENV,
    default=None,
    type=click.Path(path_type=Path),
    help=f"The worker's health file [env {HEALTH_FILE_ENV}; default: this fleet's and user's, "
    "/tmp/leaseworker/health-<digest>.json]",
)
@click.pass_context
def health(ctx: click.Context, path: Path | None, table: str | None, endpoint_url: str | None) -> None:
    """Exit 0 if the worker completed a heartbeat recently and is not shutting down, else 1.

    "Recently" is within the longer of 3 heartbeats and one lease, as the worker recorded them.
    The worker is this environment's: its table, DynamoDB endpoint and region (TABLE_NAME,
    AWS_ENDPOINT_URL_DYNAMODB, AWS_REGION, or --table and --endpoint-url), and this user's.
    """
    resolve_target(ctx, table, endpoint_url)  # the same precedence as `leaseworker run`
    fleet = fleet_of()
    scoped = path is None
    path = default_health_file() if path is None else path
    here = f" for {describe_fleet(fleet)}" if scoped else ""
    try:
        content = path.read_text(encoding="utf-8")
        owner = path.stat().st_uid
    except FileNotFoundError:
        _unhealthy(f"no health file{here} at {path}: its worker has not completed a heartbeat yet")
    except OSError as error:
        _unhealthy(f"cannot read the health file {path}: {error.strerror or error}")
    if scoped and owner != os.getuid():
        _unhealthy(f"the health file {path} belongs to another user (uid {owner})")
    ok, reason = judge(content, time.monotonic(), fleet=fleet if scoped else None)
    if not ok:
        _unhealthy(reason)
    click.echo(f"healthy: {reason}")


def _unhealthy(reason: str) -> NoReturn:
    click.echo(f"unhealthy: {reason}", err=True)
    raise SystemExit(EXIT_UNHEALTHY)
