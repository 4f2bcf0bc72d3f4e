"""The CLI imports a command's module only when the command is named (cli/main.py COMMAND_MODULES).

The worker's start runs the CLI twice (the launcher, then `run --child`) and the container's
health check runs `leaseworker health` every two heartbeats: neither may pay for the
administration commands' imports (aioboto3, the feed catalogue), 1.5 s of CPU each when they
were imported eagerly. Each case runs in a fresh interpreter, since this one has imported them.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
from leaseworker.cli.main import cli
try:
    cli.main(args=sys.argv[1:], prog_name="leaseworker", standalone_mode=False)
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("leaseworker", "aioboto3", "aiobotocore")))))
"""


def loaded_after(*argv: str) -> tuple[set[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=60, check=True
    )
    *help_lines, modules = done.stdout.strip().splitlines()
    return set(json.loads(modules)), "\n".join(help_lines)


@pytest.mark.parametrize("command", ["run", "health"])
def test_run_and_health_load_neither_the_aws_sdk_nor_the_other_commands(command: str) -> None:
    loaded, _ = loaded_after(command, "--help")
    assert f"leaseworker.cli.{command}" in loaded
    heavy = {m for m in loaded if m.startswith(("aioboto3", "aiobotocore", "leaseworker.worker.app"))}
    others = {f"leaseworker.cli.{name}" for name in ("apply", "connections", "feeds", "table")} & loaded
    assert not heavy and not others, (heavy, others)


def test_every_command_is_listed_and_a_group_keeps_its_subcommands() -> None:
    _, top = loaded_after("--help")
    for name in ("connections", "health", "local", "run", "table"):
        assert f"\n  {name} " in top, top
    _, connections = loaded_after("connections", "--help")
    for name in ("add", "apply", "list", "remove", "show"):
        assert f"\n  {name} " in connections, connections


def test_an_unknown_command_is_still_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "leaseworker", "frobnicate"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "No such command 'frobnicate'" in done.stderr
