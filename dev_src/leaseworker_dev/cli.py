"""`leaseworker local ...`: the whole system on one machine, no AWS account."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import click

from leaseworker.cli.errors import CliError
from leaseworker.cli.main import cli
from leaseworker_dev.local.services import ServiceError


@cli.group(short_help="The whole system on this machine, no AWS account.")
def local() -> None:
    """Run the system locally: DynamoDB Local, SQS (moto), a seqfeed/1 feed, real feeds' replays, workers."""


@local.command("up", short_help="Start a local fleet and show it live (or run a scripted failover).")
@click.option("--workers", default=3, show_default=True, type=click.IntRange(1, 50), help="Worker processes")
@click.option(
    "--connections",
    "n_connections",
    default=12,
    show_default=True,
    type=click.IntRange(1, 1000),
    help="Connections to add",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds to run, then stop everything [default: until q or Ctrl-C]. "
    "With --scenario: seconds of steady state between the faults [default: 5]",
)
@click.option(
    "--scenario",
    type=click.Choice(["failover"]),
    default=None,
    help="Headless: run kill, pause and graceful faults, print a summary, exit 1 if an invariant broke",
)
@click.option("--json", "as_json", is_flag=True, help="With --scenario: one JSON object on stdout")
@click.option(
    "--no-auto-faults", is_flag=True, help="Live view: do not kill and terminate a worker by itself"
)
@click.option(
    "--replays/--no-replays",
    default=True,
    show_default=True,
    help="Live view: also run the Jetstream and Coinbase replays, each with a generic/1 connection",
)
@click.option(
    "--feed-rate",
    default=20.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Messages per second per connection",
)
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep logs, sink files and the feed's session log here [default: a temporary directory]",
)
def up(  # noqa: PLR0917  (click passes options as keywords)
    workers: int,
    n_connections: int,
    duration: float | None,
    scenario: str | None,
    as_json: bool,
    no_auto_faults: bool,
    replays: bool,
    feed_rate: float,
    root: Path | None,
) -> None:
    """Start DynamoDB Local, SQS, the feed and workers; show them live; stop everything on q/Ctrl-C.

    \b
    The fleet is mixed: --connections seqfeed/1 connections, plus (unless --no-replays)
    jetstream-1, generic/1 [jetstream] on a local Jetstream replay (it replays from a cursor),
    and coinbase-1, generic/1 [coinbase-exchange] on a local Coinbase replay (it cannot: every
    takeover is a gap marker, shown as a `gap` event). The replays run on free ports of 127.0.0.1.

    \b
    Keys in the live view (the target is the worker owning most connections):
      k kill the worker child (SIGKILL; its supervisor fences: the fast path)
      h kill the whole process group (SIGKILL; a lost host: the lease path)
      p pause/resume (SIGSTOP/SIGCONT)   t terminate (SIGTERM)
      a add worker       c add connection                   s stop a connection
      q or Ctrl-C        stop every process it started, by pid, and exit
    Closing the terminal stops them too, and so does a kill of this command (even
    SIGKILL, on Linux): nothing it started outlives it, and its temporary directory goes.
    Unless --no-auto-faults, about 10 s after start it kills one worker's child,
    then terminates another, and shows how long the takeover and the handoff took.

    \b
    Timings are scaled down (lease 3 s, heartbeat 1 s, reconcile 1 s) so that
    failover is visible within seconds; docs/tuning.md derives the real ones.
    """
    require_local_extra()
    from leaseworker_dev.local.demo import run_live, run_scenario

    if as_json and scenario is None:
        raise click.UsageError("--json needs --scenario failover")
    try:
        if scenario == "failover":
            summary = run_scenario(
                workers=workers,
                connections=n_connections,
                duration=5.0 if duration is None else duration,
                root=root,
                feed_rate=feed_rate,
                as_json=as_json,
            )
            if not summary["ok"]:
                raise SystemExit(1)
            return
        run_live(
            workers=workers,
            connections=n_connections,
            duration=duration,
            auto_faults=not no_auto_faults,
            root=root,
            feed_rate=feed_rate,
            replays=replays,
        )
    except ServiceError as error:
        raise CliError(str(error)) from None


LOCAL_EXTRA_HINT = "pip install -e dev_src (moto[server] is a dependency of the development package)"


def require_local_extra() -> None:
    """The local fleet runs moto's server for SQS: moto[server] is a dependency of leaseworker-dev.

    Checked before anything starts; flask is what moto's `server` extra adds.
    """
    if any(importlib.util.find_spec(module) is None for module in ("moto", "flask")):
        raise CliError(f"`leaseworker local up` needs moto, which is not installed: {LOCAL_EXTRA_HINT}")
