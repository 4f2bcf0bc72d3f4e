"""`leaseworker connections ...`: the operator's view and control of connections."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aioboto3
import click
from rich.console import Console

from leaseworker.aws import CLI_CLIENT_CONFIG
from leaseworker.cli import feeds
from leaseworker.cli.connection_views import (
    protocol_label,
    render_show,
    render_table,
    reported,
    with_protocol,
)
from leaseworker.cli.errors import CliError, CliUsageError, check_wait_seconds, run_async
from leaseworker.cli.main import Target, cli, resolve_target, target_options
from leaseworker.lease.admin import LeaseTableAdmin, ReleaseTimeout
from leaseworker.notify import Notifier
from leaseworker.protocol import presets
from leaseworker.settings import lease_seconds_from, max_clock_skew_ms_from

T = TypeVar("T")


@cli.group()
def connections() -> None:
    """Add, stop, start, remove, list and show connections."""


async def _with_admin(
    target: Target, action: Callable[[LeaseTableAdmin], Awaitable[T]], notify: str | None
) -> T:
    session = aioboto3.Session()
    # Lease expiry is judged as an acquirer judges it (remove), with the fleet's skew allowance.
    skew_ms = max_clock_skew_ms_from(os.environ)
    lease_seconds = lease_seconds_from(os.environ)  # remove --force: an unrenewed lease, watched
    async with session.client(
        "dynamodb", endpoint_url=target.endpoint_url, config=CLI_CLIENT_CONFIG
    ) as client:
        result = await action(
            LeaseTableAdmin(client, target.table, max_clock_skew_ms=skew_ms, lease_seconds=lease_seconds)
        )
    if notify:
        await send_hint(session, notify)
    return result


async def send_hint(session: aioboto3.Session, connection_id: str) -> None:
    """The `connection_changed` fast path (docs/design.md §6) when NOTIFY_QUEUE_URL is set; never raises."""
    queue_url = os.environ.get("NOTIFY_QUEUE_URL")
    if queue_url:
        async with session.client("sqs", config=CLI_CLIENT_CONFIG) as sqs:
            await Notifier(sqs, queue_url).connection_changed(connection_id)


def _run(
    ctx: click.Context,
    table: str | None,
    endpoint_url: str | None,
    action: Callable[[LeaseTableAdmin], Awaitable[T]],
    notify: str | None = None,
) -> T:
    target = resolve_target(ctx, table, endpoint_url)
    return run_async(_with_admin(target, action, notify), table=target.table, endpoint=target.endpoint_url)


@target_options
@connections.command("add")
@click.argument("connection_id")
@click.option("--url", metavar="URL", help="seqfeed/1: the upstream, wss://... (ws:// only for loopback)")
@click.option(
    "--config",
    "config_file",
    metavar="FILE",
    help='generic/1 (or the protocol its "protocol" key names): a JSON or YAML file, - for stdin',
)
@click.option("--preset", metavar="NAME", help=f"A shipped generic/1 preset: {', '.join(presets.names())}")
@click.option(
    "--param",
    "params",
    metavar="K=V",
    multiple=True,
    help="A preset parameter, repeatable; a list is comma-separated (--param symbols=A,B)",
)
@click.pass_context
def add(
    ctx: click.Context,
    *,
    connection_id: str,
    url: str | None,
    config_file: str | None,
    preset: str | None,
    params: tuple[str, ...],
    table: str | None,
    endpoint_url: str | None,
) -> None:
    """Add a STARTED connection; a worker picks it up within one reconcile period.

    \b
    Exactly one of:
      --url URL                      seqfeed/1
      --config FILE                  generic/1, or a plugin's protocol (its "protocol" key)
      --preset NAME [--param k=v]…   a shipped preset, expanded into a generic/1 config
    The config is validated in full before anything is written. Secrets are given as
    references ({{secret:NAME#KEY}}, {{env:NAME}}), stored and shown as written; the
    worker resolves them when it connects."""
    given = [
        flag
        for flag, value in (("--url", url), ("--config", config_file), ("--preset", preset))
        if value is not None
    ]
    if len(given) != 1:
        said = f" (got {' and '.join(given)})" if given else ""
        raise CliUsageError(f"give exactly one of --url, --config or --preset{said}")
    if params and preset is None:
        raise CliUsageError("--param goes with --preset")
    env = os.environ
    if url is not None:
        feed = feeds.feed_from_url(url, env)
    elif config_file is not None:
        feed = feeds.feed_from_file(config_file, env)
    else:
        assert preset is not None
        feed = feeds.feed_from_preset(preset, params, env)
    _run(
        ctx,
        table,
        endpoint_url,
        lambda admin: admin.add(
            connection_id,
            feed.ws_url,
            protocol=feed.protocol,
            protocol_config=feed.protocol_config,
            preset=feed.preset,
        ),
        notify=connection_id,
    )
    click.echo(
        f"added {connection_id} ({protocol_label({'protocol': feed.protocol, 'preset': feed.preset})})"
    )


@target_options
@connections.command("stop")
@click.argument("connection_id")
@click.pass_context
def stop(ctx: click.Context, connection_id: str, table: str | None, endpoint_url: str | None) -> None:
    """Set desired_state STOPPED: its owner closes and releases it."""
    _run(ctx, table, endpoint_url, lambda admin: admin.stop(connection_id), notify=connection_id)
    click.echo(f"stopped {connection_id}")


@target_options
@connections.command("start")
@click.argument("connection_id")
@click.pass_context
def start(ctx: click.Context, connection_id: str, table: str | None, endpoint_url: str | None) -> None:
    """Set desired_state STARTED (and clear a recorded failure)."""
    _run(ctx, table, endpoint_url, lambda admin: admin.start(connection_id), notify=connection_id)
    click.echo(f"started {connection_id}")


@target_options
@connections.command("remove")
@click.argument("connection_id")
@click.option("--force", is_flag=True, help="Stop it first, wait for its owner to release it, then remove it")
@click.option(
    "--wait",
    "wait_seconds",
    type=float,
    default=60.0,
    show_default=True,
    help="With --force: how long to wait for the release, in seconds",
)
@click.pass_context
def remove(
    ctx: click.Context,
    *,
    connection_id: str,
    force: bool,
    wait_seconds: float,
    table: str | None,
    endpoint_url: str | None,
) -> None:
    """Remove a STOPPED, released connection (--force: stop it and wait for the release).

    \b
    Its epoch is kept: a later `add` of the same id continues above it, so
    consumers and upstreams that remember the highest epoch see it rise.
    """
    check_wait_seconds(wait_seconds)

    async def forced(admin: LeaseTableAdmin) -> None:
        try:
            await admin.remove_forced(
                connection_id,
                hint=lambda: send_hint(aioboto3.Session(), connection_id),
                wait_seconds=wait_seconds,
                progress=lambda line: click.echo(line, err=True),
            )
        except ReleaseTimeout as timeout:
            raise CliError(str(timeout)) from None

    _run(ctx, table, endpoint_url, forced if force else lambda admin: admin.remove(connection_id))
    click.echo(f"removed {connection_id}")


@target_options
@connections.command("list")
@click.option("--json", "as_json", is_flag=True, help="A JSON array, one object per connection")
@click.pass_context
def list_(ctx: click.Context, as_json: bool, table: str | None, endpoint_url: str | None) -> None:
    """Every connection: state, owner, epoch, lease, checkpoint, last error.

    \b
    The checkpoint is the effective one: the newer of the item's last_seq and its
    owner's batched checkpoint entry (session mode), what a takeover resumes after."""
    items = [with_protocol(item) for item in _run(ctx, table, endpoint_url, lambda admin: admin.list())]
    if as_json:
        click.echo(json.dumps([reported(item) for item in items], indent=2))
        return
    target = resolve_target(ctx, table, endpoint_url)
    if not items:
        click.echo(
            f"no connections in {target.table}: add one with `leaseworker connections add ID --url URL`"
        )
        return
    Console(width=None if sys.stdout.isatty() else PIPED_WIDTH).print(
        render_table(items, title=f"{len(items)} connections in {target.table}")
    )


@target_options
@connections.command("show")
@click.argument("connection_id")
@click.option("--json", "as_json", is_flag=True, help="The item as a JSON object (the stored values)")
@click.pass_context
def show(
    ctx: click.Context, connection_id: str, as_json: bool, table: str | None, endpoint_url: str | None
) -> None:
    """Every attribute of one connection: protocol, preset, config, URL, checkpoint and cursor.

    \b
    The config is shown as stored: secrets are references ({{secret:NAME#KEY}}),
    never resolved. The URL is shown with its query values redacted."""
    item = with_protocol(_run(ctx, table, endpoint_url, lambda admin: admin.show(connection_id)))
    if as_json:
        click.echo(json.dumps(reported(item), indent=2))
        return
    click.echo(render_show(item, int(time.time() * 1000)))


# Piped or redirected, a table is as wide as its rows (not folded at 80 columns): it is read by
# grep, less -S or a file, not a terminal's width.
PIPED_WIDTH = 10_000
