"""`leaseworker connections apply -f FILE [--dry-run] [--prune]`: make the table match a file.

This is how a team keeps its feeds in git (docs/feeds.md, "Feeds by file"). In order:

1. read and validate every entry (cli/apply_file.py); a bad file writes nothing (exit 2);
2. read the table once (one consistent scan) and diff (cli/apply_plan.py); print the diff;
3. `--dry-run` stops here. Otherwise write the changes: one conditional update per connection
   (an add may not overwrite a live item; an update, start or stop only a live one, and none
   touches a lease's owner, epoch or the checkpoint), up to 100 in one TransactWriteItems, at
   most WRITE_CONCURRENCY calls in flight (lease/connection_writes.py, cli/apply_writes.py);
4. `--prune`: the connections the file no longer lists were stopped in step 3; wait (at most
   --wait seconds) for their owners to release them, and remove them by the rules of
   `connections remove` (lease/removal.py). One still held when the wait ends stays STOPPED.

A second apply of the same file finds nothing to change and says so. Exit status: 0 when the
table matches, 1 when a write failed or a pruned connection is still held, 2 for a bad file.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Final

import aioboto3
import click
from aiobotocore.config import AioConfig

from leaseworker.cli.apply_file import load_desired
from leaseworker.cli.apply_plan import Change, Plan, make_plan
from leaseworker.cli.apply_writes import Progress, WriteFailure, prune_held, write_changes
from leaseworker.cli.connections import connections
from leaseworker.cli.errors import CliError, check_wait_seconds, run_async
from leaseworker.cli.main import resolve_target, target_options
from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.notify import Notifier
from leaseworker.settings import lease_seconds_from, max_clock_skew_ms_from

WRITE_CONCURRENCY: Final = 8  # calls in flight: transactions of up to 100 writes, or single removals
MAX_HINTS: Final = 500  # beyond this the workers' own reconcile and audit find the changes
APPLY_CLIENT_CONFIG: Final = AioConfig(
    connect_timeout=2,
    read_timeout=10,
    retries={"max_attempts": 3, "mode": "standard"},  # throttles on a cold on-demand table
    max_pool_connections=WRITE_CONCURRENCY,
)


class ApplyFailed(CliError):
    """Exit 1 after every failure's own line (the changes that did land stay: apply again)."""

    def __init__(self, failures: list[WriteFailure], plan: Plan) -> None:
        super().__init__(
            f"{len(failures)} of {len(plan.changes)} changes not applied; the others were: "
            "fix the cause and apply again"
        )
        self.failures = failures

    def show(self, file: object = None) -> None:
        for failure in self.failures[:50]:
            click.echo(f"error: {failure.line}", err=True)
        if len(self.failures) > 50:
            click.echo(f"error: … and {len(self.failures) - 50} more", err=True)
        click.echo(f"error: {self.message}", err=True)


@target_options
@connections.command("apply")
@click.option(
    "-f", "--file", "path", required=True, metavar="FILE", help="The connections, YAML or JSON (- for stdin)"
)
@click.option("--dry-run", is_flag=True, help="Print the changes and write nothing")
@click.option("--prune", is_flag=True, help="Stop and remove the connections the file does not list")
@click.option(
    "--wait",
    "wait_seconds",
    type=float,
    default=60.0,
    show_default=True,
    help="With --prune: how long to wait for owners to release what it stops, in seconds",
)
@click.pass_context
def apply(
    ctx: click.Context,
    *,
    path: str,
    dry_run: bool,
    prune: bool,
    wait_seconds: float,
    table: str | None,
    endpoint_url: str | None,
) -> None:
    """Create, update, start and stop connections to match FILE.

    \b
    FILE lists the connections (docs/feeds.md, "Feeds by file"):
      connections:
        - id: feed-1
          url: wss://feeds.example.com/feed-1      # seqfeed/1
        - id: trades
          preset: coinbase-exchange                 # a shipped preset
          params: {product_ids: [BTC-USD, ETH-USD]}
          state: stopped                            # started (default) | stopped
        - id: ha
          config: {connect: {url: ...}}             # generic/1, inline
    Every entry is validated before anything is written. A second apply of the
    same file changes nothing. --prune removes only connections that are stopped
    and released, as `connections remove` does."""
    check_wait_seconds(wait_seconds)
    desired = load_desired(path, os.environ)  # before any network: a bad file writes nothing
    source = "<stdin>" if path == "-" else path
    target = resolve_target(ctx, table, endpoint_url)
    started = time.monotonic()

    async def run() -> None:
        session = aioboto3.Session()
        async with session.client(
            "dynamodb", endpoint_url=target.endpoint_url, config=APPLY_CLIENT_CONFIG
        ) as client:
            admin = LeaseTableAdmin(
                client,
                target.table,
                max_clock_skew_ms=max_clock_skew_ms_from(os.environ),
                lease_seconds=lease_seconds_from(os.environ),
            )
            plan = make_plan(desired, await admin.list(), prune=prune)
            if not plan.changes:
                agreed = "connection matches" if plan.unchanged == 1 else "connections match"
                click.echo(f"no changes: {plan.unchanged} {agreed} {source}")
                return
            for change in plan.changes:
                click.echo(change.line())
            if dry_run:
                click.echo(f"dry run: {plan.summary(done=False)}; nothing written")
                return
            await _apply(admin, session, plan, wait_seconds, lease_seconds_from(os.environ))
        click.echo(f"applied {source}: {plan.summary(done=True)} ({time.monotonic() - started:.1f} s)")

    run_async(run(), table=target.table, endpoint=target.endpoint_url)


async def _apply(
    admin: LeaseTableAdmin, session: aioboto3.Session, plan: Plan, wait_seconds: float, lease_seconds: float
) -> None:
    progress = Progress.on_terminal(sys.stderr, total=len(plan.changes) + plan.count("remove"))
    with progress:
        failures = await write_changes(admin, plan.changes, WRITE_CONCURRENCY, progress)
        failed = {failure.connection_id for failure in failures}
        await _hints(session, [c for c in plan.changes if c.connection_id not in failed])
        pruned = [
            c.connection_id for c in plan.changes if c.kind == "remove" and c.connection_id not in failed
        ]
        if pruned:
            failures += await prune_held(
                admin,
                pruned,
                lease_seconds=lease_seconds,
                wait_seconds=wait_seconds,
                concurrency=WRITE_CONCURRENCY,
                progress=progress,
            )
    if failures:
        raise ApplyFailed(failures, plan)


async def _hints(session: aioboto3.Session, changes: list[Change]) -> None:
    """The `connection_changed` fast path for the first MAX_HINTS changes, stops and removals
    first (their owners should let go at once); never raises."""
    queue_url = os.environ.get("NOTIFY_QUEUE_URL")
    if not queue_url or not changes:
        return
    first = sorted(changes, key=lambda change: change.kind not in ("stop", "remove"))[:MAX_HINTS]
    limit = asyncio.Semaphore(WRITE_CONCURRENCY)

    async def one(connection_id: str, notifier: Notifier) -> None:
        async with limit:
            await notifier.connection_changed(connection_id)

    async with session.client("sqs") as sqs:
        notifier = Notifier(sqs, queue_url)
        async with asyncio.TaskGroup() as group:
            for change in first:
                group.create_task(one(change.connection_id, notifier))
