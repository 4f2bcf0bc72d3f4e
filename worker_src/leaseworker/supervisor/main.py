"""`python -m leaseworker.supervisor [--preload-clients] -- CHILD ARGV...`: supervise one worker child.

`leaseworker run` validates the settings, decides WORKER_ID and then execs this (same pid: PID 1
in the container) with `--preload-clients`: the fence's botocore clients are set up while the
child runs, so that a death is fenced in milliseconds rather than after botocore's import (about
0.5 s, cli/run.py). Without the flag the supervisor stays on the standard library until a fence
is needed. The child inherits the environment, WORKER_ID included: that is whose session gets
fenced.

Log lines are JSON on stderr, like the worker's, without the worker's logging stack.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from leaseworker.supervisor.process import (
    EXIT_NOT_STARTED,
    ChildExit,
    SpawnError,
    block_watched_signals,
    spawn,
    wait_for_exit,
)

if TYPE_CHECKING:
    from leaseworker.supervisor.fence import FenceClients

EXIT_USAGE = 2
USAGE = "usage: python -m leaseworker.supervisor [--preload-clients] -- CHILD ARGV..."
PRELOAD_FLAG = "--preload-clients"


def log(level: str, message: str, **fields: Any) -> None:
    line = {"level": level, "logger": "leaseworker.supervisor", "message": message, **fields}
    print(json.dumps(line, separators=(",", ":"), default=str), file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str]) -> tuple[bool, list[str]] | None:
    """(preload the fence clients?, the child's argv), or None when `argv` is not valid."""
    if "--" not in argv:
        return None
    split = list(argv).index("--")
    options, child = list(argv[:split]), list(argv[split + 1 :])
    if not child or any(option != PRELOAD_FLAG for option in options):
        return None
    return PRELOAD_FLAG in options, child


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run the child to its end; returns the status to exit with (the child's own)."""
    parsed = parse_args(sys.argv[1:] if argv is None else argv)
    environment = dict(os.environ if env is None else env)
    if parsed is None:
        print(USAGE, file=sys.stderr)
        return EXIT_USAGE
    preload, child_argv = parsed
    worker_id = environment.get("WORKER_ID", "")
    if not worker_id:
        print("error: WORKER_ID is not set: start the supervisor with `leaseworker run`", file=sys.stderr)
        return EXIT_USAGE
    child_mask = block_watched_signals()
    try:
        pid = spawn(child_argv, environment, child_mask=child_mask)
    except SpawnError as error:
        print(f"error: {error}", file=sys.stderr)
        return 127
    clients = _preload_clients(environment) if preload else None
    ended = wait_for_exit(pid)
    observed_at = time.monotonic()
    if ended.clean or ended.code == EXIT_NOT_STARTED:
        # Not started: the worker printed why and wrote no session item, so nothing is fenced;
        # its status is ours, and ECS shows it (the supervisor never restarts a child).
        return ended.status
    confirm_death(ended, environment, observed_at=observed_at, clients=clients, pid=pid)
    return ended.status


def confirm_death(
    ended: ChildExit,
    env: Mapping[str, str],
    *,
    observed_at: float,
    clients: FenceClients | None,
    pid: int,
) -> None:
    """The fast path of docs/design.md §2e: fence the dead child's session, hint its connections."""
    from leaseworker.supervisor.fence import FenceTarget, run_fast_path

    target = FenceTarget.from_environment(env)
    reason = f"worker process {ended.describe()} (pid {pid})"
    report = run_fast_path(target, reason, observed_at=observed_at, clients=clients)
    log(
        "WARNING" if report.finished and not report.errors else "ERROR",
        "worker child died: session fenced as a confirmed death"
        if report.session == "fenced"
        else "worker child died: session not fenced by this supervisor",
        worker_id=target.worker_id,
        child_exit=ended.describe(),
        exit_status=ended.status,
        session=report.session,
        checkpoint=report.checkpoint,
        owned=report.owned,
        hinted=report.hinted,
        elapsed_ms=report.marks_ms,
        finished=report.finished,
        errors=report.errors[:5],
    )


def _preload_clients(env: Mapping[str, str]) -> FenceClients | None:
    """Pay botocore's import and client set-up now, while the child runs, to save it after a death."""
    from leaseworker.supervisor.fence import FenceTarget, open_clients

    try:
        return open_clients(FenceTarget.from_environment(env))
    except Exception as error:  # the fence will try again, lazily, if it is ever needed
        log("WARNING", "could not preload the fence clients", error=f"{type(error).__name__}: {error}")
        return None
