"""`leaseworker`: run a worker, administer the lease table, run the local fleet."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

import click
from click.core import ParameterSource

from leaseworker import __version__
from leaseworker.cli.errors import CliError, CliUsageError
from leaseworker.settings import DEFAULT_TABLE


@dataclass
class Target:
    """Which lease table the command acts on: --table / TABLE_NAME, --endpoint-url / AWS_ENDPOINT_URL."""

    table: str
    endpoint_url: str | None
    table_typed: bool = False  # given on the command line (not read from the environment)
    endpoint_typed: bool = False


def typed(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE


def target_options(command: click.Command) -> click.Command:
    """--table and --endpoint-url on every command (they also work before the subcommand)."""
    command.params.extend(
        [
            click.Option(
                ["--table"],
                envvar="TABLE_NAME",
                default=None,
                help=f"Lease table name [env TABLE_NAME; default {DEFAULT_TABLE}]",
            ),
            click.Option(
                ["--endpoint-url"],
                envvar=["AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL"],
                default=None,
                help="DynamoDB endpoint, e.g. DynamoDB Local [env AWS_ENDPOINT_URL(_DYNAMODB)]",
            ),
        ]
    )
    return command


def resolve_target(ctx: click.Context, table: str | None, endpoint_url: str | None) -> Target:
    """A value typed on the command line wins, after the subcommand or before it; only then the
    environment (`TABLE_NAME=A leaseworker --table B connections list` acts on B)."""
    parent = ctx.find_object(Target)
    if parent is not None:
        if parent.table_typed and not typed(ctx, "table"):
            table = parent.table
        if parent.endpoint_typed and not typed(ctx, "endpoint_url"):
            endpoint_url = parent.endpoint_url
    resolved = Target(
        table=table or (parent.table if parent else None) or DEFAULT_TABLE,
        endpoint_url=endpoint_url or (parent.endpoint_url if parent else None),
    )
    if resolved.endpoint_url:
        parts = urlsplit(resolved.endpoint_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CliUsageError(
                f"invalid --endpoint-url {resolved.endpoint_url!r}: must be an http(s):// URL with a host"
            )
    # botocore reads AWS_DEFAULT_REGION, not AWS_REGION (which the worker and docs/design.md §7 use).
    if os.environ.get("AWS_REGION") and not os.environ.get("AWS_DEFAULT_REGION"):
        os.environ["AWS_DEFAULT_REGION"] = os.environ["AWS_REGION"]
    # The worker's settings read the same variables: keep them consistent for this process.
    # The endpoint is DynamoDB's only; SQS and Kinesis keep botocore's own endpoint resolution.
    os.environ["TABLE_NAME"] = resolved.table
    if resolved.endpoint_url:
        os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = resolved.endpoint_url
    return resolved


# Each subcommand's module, imported only when the command is named (or for --help). The worker's
# start runs this CLI twice (`leaseworker run` execs the supervisor, which starts `run --child`)
# and the container's health check runs `leaseworker health` every two heartbeats: imported
# eagerly, the administration commands (aioboto3, the feed catalogue, the local fleet) cost each
# of them 1.5 s of CPU before doing anything (measured 2026-12-07: `leaseworker --help` 1.53 s).
COMMAND_MODULES: Final = {
    "connections": "leaseworker.cli.apply",  # adds `apply` to connections.py's group
    "health": "leaseworker.cli.health",
    "local": "leaseworker_dev.cli",  # the development package's, when it is installed
    "run": "leaseworker.cli.run",
    "table": "leaseworker.cli.table",
}


class LazyCommands(click.Group):
    """A group whose commands register themselves when their module is first imported."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMAND_MODULES})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMAND_MODULES:
            if cmd_name == "local":
                register_local()
            else:
                importlib.import_module(COMMAND_MODULES[cmd_name])
        return self.commands.get(cmd_name)


@click.group(
    cls=LazyCommands,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="leaseworker")
@click.pass_context
def cli(ctx: click.Context, table: str | None = None, endpoint_url: str | None = None) -> None:
    """Long-lived upstream WebSocket feeds, each consumed by exactly one worker.

    \b
    Ownership is a lease in a DynamoDB table: a crashed worker's connections are
    taken over once its lease expires; a worker that is shut down hands them
    over at once. Every command works against AWS (your usual credentials and
    region) or against DynamoDB Local (--endpoint-url).

    \b
    On a laptop, no AWS account:
      leaseworker local up                        fleet + live view (make demo)
      leaseworker local up --scenario failover --json
                                                  kill/pause/terminate, numbers
    Against a deployed table (--table: the stack's TableName output):
      leaseworker --table T connections add feed-1 --url wss://example.com/feed
      leaseworker --table T connections list
      leaseworker --table T connections show feed-1
    """
    ctx.obj = Target(
        table or os.environ.get("TABLE_NAME") or DEFAULT_TABLE,
        endpoint_url,
        table_typed=typed(ctx, "table"),
        endpoint_typed=typed(ctx, "endpoint_url"),
    )


target_options(cli)


DEV_PACKAGE = "leaseworker_dev"
DEV_PACKAGE_HINT = (
    "`leaseworker local` is a development tool, not part of this install: from a checkout, "
    "run `make demo` (or pip install -e dev_src)"
)


def register_local() -> None:
    """`leaseworker local …` comes from the development package (dev_src/leaseworker_dev/cli.py),
    which the image never has; without it, the command says in one line how to get it."""
    try:
        importlib.import_module(COMMAND_MODULES["local"])  # registers `local`
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] != DEV_PACKAGE:
            raise

        @cli.command(
            "local",
            short_help="The whole system on this machine (needs the development package).",
            context_settings={
                "ignore_unknown_options": True,
                "allow_extra_args": True,
                "help_option_names": [],
            },
        )
        def local() -> None:
            raise CliError(DEV_PACKAGE_HINT)


def main() -> None:
    cli(prog_name="leaseworker")


if __name__ == "__main__":
    main()
