"""`leaseworker table create`."""

from __future__ import annotations

import aioboto3
import click

from leaseworker.aws import CLI_CLIENT_CONFIG
from leaseworker.cli.errors import run_async
from leaseworker.cli.main import Target, cli, resolve_target, target_options
from leaseworker.lease.admin import LeaseTableAdmin


@cli.group()
def table() -> None:
    """The lease table."""


@target_options
@table.command("create")
@click.pass_context
def create(ctx: click.Context, table: str | None, endpoint_url: str | None) -> None:
    """Create the lease table and its by-state-expiry index (no-op if it exists)."""
    target = resolve_target(ctx, table, endpoint_url)
    created = run_async(_create(target), table=target.table, endpoint=target.endpoint_url)
    click.echo(f"table {target.table} {'created' if created else 'already exists'}")


async def _create(target: Target) -> bool:
    async with aioboto3.Session().client(
        "dynamodb", endpoint_url=target.endpoint_url, config=CLI_CLIENT_CONFIG
    ) as client:
        return await LeaseTableAdmin(client, target.table).create_table()
