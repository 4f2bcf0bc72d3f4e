"""`leaseworker local up`: bring the fleet up, show it (live or scripted), and always tear it down.

Every process is a child of this one, started in its own session and stopped by pid on the way
out: on q, Ctrl-C, SIGTERM, SIGHUP, the end of --duration, an error, or the terminal going away.
The three signals are handled by `StopSignals` whatever disposition this process inherited (a
background job starts with SIGINT ignored); during teardown they are only recorded, so a second
Ctrl-C cannot leave processes behind. Nothing the teardown prints may stop it: once the terminal
is gone every write fails (EIO), and the fleet is stopped all the same. If this process dies
without a teardown, `Lifeline` (local/lifeline.py) stops the fleet and removes the directory.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console

from leaseworker_dev.local.fleet import FAST, Fleet
from leaseworker_dev.local.lifeline import Lifeline
from leaseworker_dev.local.scenario import FailoverScenario
from leaseworker_dev.local.stopping import StopSignals


@contextlib.contextmanager
def _scratch(root: Path | None) -> Iterator[Path]:
    """The fleet's directory: `root` if given (kept), else a temporary one (removed)."""
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
        yield root
        return
    path = Path(tempfile.mkdtemp(prefix="leaseworker-local-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_live(
    *,
    workers: int,
    connections: int,
    duration: float | None,
    auto_faults: bool,
    root: Path | None,
    feed_rate: float,
    replays: bool = True,
) -> None:
    from leaseworker_dev.local.view import LiveView

    err = Console(stderr=True, soft_wrap=True, highlight=False)
    with StopSignals() as stop, _scratch(root) as base, Lifeline(remove=None if root else base):
        fleet = Fleet(base, timings=FAST, feed_rate=feed_rate, replays=replays)
        view: LiveView | None = None
        try:
            # Start-up has no loop that could check for a stop request: there a signal raises.
            services = "the feed, the Jetstream and Coinbase replays" if replays else "the feed"
            with stop.raising(), err.status(f"starting DynamoDB Local, SQS (moto), {services} in {base} …"):
                fleet.start()
            view = LiveView(
                fleet,
                workers=workers,
                connections=connections,
                duration=duration,
                auto_faults=auto_faults,
                stop=stop,
            )
            view.run()  # returns on q, a stop signal or the end of --duration, its display closed
        except KeyboardInterrupt:
            pass
        except OSError as error:
            if not output_gone(error):
                raise
            stop.hang_up()
        finally:
            # From here on signals are only recorded: the teardown is bounded and must finish.
            began = time.monotonic()
            why = f"{stop.received.name}: " if stop.received is not None else ""
            say(err, f"{why}stopping {len(fleet.children())} processes by pid …")
            try:
                if view is not None:
                    view.shutdown()
                else:
                    fleet.stop()
            finally:
                for line in view.fault_summary() if view is not None else ():
                    say(err, f"  {line}")
                say(
                    err,
                    f"stopped: every process this command started has exited "
                    f"({time.monotonic() - began:.1f} s)",
                )


def output_gone(error: OSError) -> bool:
    """The terminal hung up (EIO, ENXIO) or the pipe's reader left (EPIPE): nobody is watching."""
    return error.errno in (errno.EIO, errno.ENXIO, errno.EPIPE)


def say(console: Console, text: str) -> None:
    """Print if anyone can still read it: a write to a terminal that went away never interrupts
    the teardown."""
    with contextlib.suppress(OSError, ValueError):
        console.print(text)


def run_scenario(
    *, workers: int, connections: int, duration: float, root: Path | None, feed_rate: float, as_json: bool
) -> dict[str, Any]:
    err = Console(stderr=True, soft_wrap=True)

    def progress(message: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # as `say`: output gone never stops the run
            err.print(f"[dim]local up:[/] {message}", highlight=False)

    with StopSignals() as stop, stop.raising(), _scratch(root) as base, Lifeline(None if root else base):
        scenario = FailoverScenario(
            base,
            workers=workers,
            connections=connections,
            duration=duration,
            feed_rate=feed_rate,
            progress=progress,
        )
        summary = scenario.run()
    if as_json:
        import json

        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    else:
        _print_summary(summary, Console())
    return summary


def _print_summary(summary: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    table = Table(title="failover scenario", title_justify="left")
    for column in ("scenario", "worker", "connections", "max s", "bound s", "ok"):
        table.add_column(column)
    for result in summary["scenarios"]:
        table.add_row(
            result["scenario"],
            result["worker"],
            str(result["connections"]),
            f"{result['max_s']:.2f}",
            f"{result['bound_s']:.1f}",
            "yes" if result["ok"] else "NO",
        )
    console.print(table)
    totals = summary["totals"]
    console.print(
        f"delivered {totals['delivered']} seqs over {totals['connections']} connections, "
        f"{totals['duplicated']} duplicated (replay after a takeover), {totals['missing']} missing"
    )
    for name, check in summary["invariants"].items():
        verdict = "[green]ok[/]" if check["ok"] else "[red]BROKEN[/]: " + "; ".join(check["violations"][:3])
        console.print(f"{name}: {verdict}")
