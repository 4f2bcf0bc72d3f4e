"""`python -m leaseworker_dev.chaos.unsafe_worker`: `leaseworker run` with a negative control on.

The fault suite's negative controls (chaos/unsafe.py) break a safety rule on purpose, so they are
reachable from here only: the chaos runner starts a worker through this entry point when a run
asks for a switch (`python -m leaseworker_dev.chaos --unsafe NAME`). It is `leaseworker run`, the
supervisor and then the worker as its child, with one difference: the child applies the switches
named in LEASEWORKER_UNSAFE_TEST_ONLY_DISABLE before the worker starts. `leaseworker run` never
reads that variable, so no setting, deploy or environment can reach a switch in production.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from leaseworker.cli import run as run_command
from leaseworker.cli.main import cli
from leaseworker.observability.logging import configure_logging
from leaseworker.settings import SettingsError
from leaseworker_dev.chaos import unsafe

MODULE = "leaseworker_dev.chaos.unsafe_worker"
CHILD_FLAG = "--child"
USAGE = f"usage: python -m {MODULE} [{CHILD_FLAG}]  (the environment as for `leaseworker run`)"


def child_argv() -> list[str]:
    """How the supervisor starts the worker: this module again, as the child."""
    return [sys.executable, "-m", MODULE, CHILD_FLAG]


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == [CHILD_FLAG]:
        configure_logging(os.environ.get("LOG_LEVEL", "INFO"))
        try:
            unsafe.apply_from_environment(os.environ)
        except SettingsError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)
        command = ["run", "--child"]
    elif not args:
        # The parent validates the settings and execs the supervisor, as `leaseworker run` does,
        # with this module's child in place of the product's.
        setattr(run_command, "child_argv", child_argv)  # noqa: B010
        command = ["run"]
    else:
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    cli.main(args=command, prog_name="leaseworker")


if __name__ == "__main__":
    main()
