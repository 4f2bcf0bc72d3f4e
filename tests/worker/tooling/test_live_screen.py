"""The live view's frame (leaseworker_dev.local.screen), drawn from a monitor's readings without a
fleet: it fits the terminal with the key bar last and never cut off, and its checkpoint and lag
columns use the effective checkpoint (session mode keeps checkpoints in the owner's checkpoint
item, so the connection item's last_seq stays -1 while data flows)."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from rich.console import Console

from leaseworker.lease.vocabulary import SESSION_HELD
from leaseworker_dev.local.events import Event
from leaseworker_dev.local.fleet import Fleet, WorkerProcess
from leaseworker_dev.local.stopping import StopSignals
from leaseworker_dev.local.view import LiveView


def _view(tmp_path: Path, *, width: int, height: int, connections: int = 14) -> tuple[LiveView, io.StringIO]:
    fleet = Fleet(tmp_path)
    fleet.dynamodb = cast(Any, SimpleNamespace(url="http://127.0.0.1:8000"))
    fleet.feed_url = "ws://127.0.0.1:9000"
    for i in range(1, 4):
        process = SimpleNamespace(pid=4000 + i, popen=SimpleNamespace(poll=lambda: None), alive=lambda: True)
        fleet.workers[f"w{i}"] = WorkerProcess(f"w{i}", cast(Any, process))
    out = io.StringIO()
    console = Console(file=out, width=width, height=height, force_terminal=True, color_system=None)
    view = LiveView(
        fleet,
        workers=3,
        connections=connections,
        duration=None,
        auto_faults=False,
        stop=StopSignals(),
        console=console,
    )
    for n in range(connections):
        cid = f"feed-{n:02d}"
        view.monitor.items[cid] = {
            "connection_id": cid,
            "desired_state": "STARTED",
            "lease_owner": f"w{n % 3 + 1}",
            "lease_epoch": 1,
            "lease_expires_at_ms": SESSION_HELD,
            "last_seq": -1,  # session mode: the item's own last_seq has not moved
            "checkpoint": 880 + n,  # the owner's batched entry, as the snapshot computed it
        }
        view.monitor.sink_max[cid] = 900 + n
    for n in range(40):
        view.monitor.events.append(Event(time.time(), "note", f"event number {n}"))
    return view, out


def _frame(view: LiveView, out: io.StringIO) -> list[str]:
    view.console.print(view.render())
    return out.getvalue().rstrip("\n").split("\n")


@pytest.mark.parametrize(("width", "height"), [(100, 30), (80, 24), (160, 40)])
def test_the_key_bar_is_the_last_line_and_the_frame_fits(tmp_path: Path, width: int, height: int) -> None:
    view, out = _view(tmp_path, width=width, height=height)
    lines = _frame(view, out)
    assert len(lines) <= height - 1, "\n".join(lines)  # the cursor takes the last line
    assert "q/Ctrl-C quit" in lines[-1], "\n".join(lines)  # the bar may take two lines
    assert lines[-1].startswith("keys: k kill") or lines[-2].startswith("keys: k kill"), "\n".join(lines)
    assert any(line.startswith("workers") for line in lines)
    assert any(line.startswith("events") for line in lines)


def test_a_small_terminal_says_how_many_connections_it_does_not_show(tmp_path: Path) -> None:
    view, out = _view(tmp_path, width=100, height=30, connections=1000)
    lines = _frame(view, out)  # without drawing the 1000 rows first (it would take seconds)
    assert len(lines) <= 29
    hidden = re.search(r"… and (\d+) more \(a taller terminal shows them\)", "\n".join(lines))
    assert hidden is not None, "\n".join(lines)
    shown = [line for line in lines if re.match(r" ?feed-\d+ ", line)]
    assert len(shown) + int(hidden.group(1)) == 1000
    assert "q/Ctrl-C quit" in lines[-1], "\n".join(lines)


def test_a_tall_terminal_shows_everything(tmp_path: Path) -> None:
    view, out = _view(tmp_path, width=200, height=80)
    text = "\n".join(_frame(view, out))
    assert "more (a taller terminal" not in text
    assert "FAST timings: lease" in text
    assert "checkpoint = what a takeover resumes after" in text
    assert len(re.findall(r"^ ?feed-\d+ ", text, flags=re.MULTILINE)) == 14


def test_checkpoint_and_lag_are_the_effective_checkpoints(tmp_path: Path) -> None:
    view, out = _view(tmp_path, width=200, height=80)
    text = "\n".join(_frame(view, out))
    assert re.search(r"connection +state +owner +epoch +checkpoint +lag ", text), text
    # feed-03: checkpoint 883 (not the item's last_seq -1), lag 903 - 883 = 20
    assert re.search(r"^ ?feed-03 +STARTED +w1 +1 +883 +20 +seqfeed/1 ", text, flags=re.MULTILINE), text
    assert view.monitor.lag("feed-03") == 20
