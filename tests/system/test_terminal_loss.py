"""Closing the terminal never leaves the local fleet running (issue 23, part 2).

`leaseworker local up` runs in a detached tmux session, as a user's terminal window would hold
it. Once the fleet is up, `tmux kill-session` closes the window: the pty goes away and the
command gets SIGHUP, and every write to the terminal fails from then on. Afterwards no process of
that fleet may be left (DynamoDB Local's java, moto, the feed, the supervisors, the workers) and
its temporary directory must be gone.

A private tmux server (`-S`, a socket in the test's directory) keeps the test away from anyone
else's tmux sessions; it exits with its last session.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.system.procscan import MARKER_VAR, processes_with_marker

LEASEWORKER = Path(sys.executable).with_name("leaseworker")
UP_S = 30.0  # DynamoDB Local, moto and the feed start, then 2 workers own 4 connections
# Gone after the window closed: the workers stop gracefully in about a second; a worker that had
# to be SIGKILLed after its grace (FAST: 10 s) would still fit, a fleet left running never does.
GONE_S = 15.0

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


def _tmux(socket: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # Without the marker: the tmux server is not part of the fleet.
    env = {k: v for k, v in os.environ.items() if k != MARKER_VAR and not k.startswith("TMUX")}
    return subprocess.run(
        ["tmux", "-S", str(socket), *args], env=env, capture_output=True, text=True, timeout=10, check=False
    )


def test_closing_the_terminal_stops_the_fleet(tmp_path: Path, marker: str) -> None:
    socket = tmp_path / "tmux.sock"
    scratch = tmp_path / "tmp"  # the fleet's temporary directory is made in here
    scratch.mkdir()
    command = shlex.join(
        [
            "env",
            f"{MARKER_VAR}={marker}",
            f"TMPDIR={scratch}",
            "TERM=xterm-256color",
            str(LEASEWORKER),
            *("local", "up", "--no-auto-faults", "--no-replays", "--workers", "2", "--connections", "4"),
        ]
    )
    started = _tmux(socket, "new-session", "-d", "-s", "fleet", "-x", "160", "-y", "45", command)
    assert started.returncode == 0, started.stderr
    try:
        deadline = time.monotonic() + UP_S
        screen = ""
        while "all 4 connections owned" not in screen:
            assert time.monotonic() < deadline, f"not up within {UP_S} s; the screen:\n{screen}"
            time.sleep(0.5)
            screen = _tmux(socket, "capture-pane", "-p", "-t", "fleet").stdout
        running = processes_with_marker(marker)
        assert len(running) >= 7, running  # java, moto, the feed, 2 supervisors, 2 worker children
        assert [p.name for p in scratch.iterdir()], "no temporary directory in TMPDIR"

        closed = _tmux(socket, "kill-session", "-t", "fleet")
        assert closed.returncode == 0, closed.stderr
        killed = time.monotonic()
        while processes_with_marker(marker) or any(scratch.iterdir()):
            if time.monotonic() - killed > GONE_S:
                break
            time.sleep(0.2)
        gone_s = time.monotonic() - killed
    finally:
        _tmux(socket, "kill-server")
    left = processes_with_marker(marker)
    print(f"tmux kill-session → every process gone and the directory removed in {gone_s:.2f} s")
    assert left == [], [_describe(pid) for pid in left]
    assert list(scratch.iterdir()) == [], "temporary directory left behind"


def _describe(pid: int) -> str:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        args = "?"
    return f"{pid}: {args[:120]}"


def test_a_sigkilled_local_up_leaves_nothing(tmp_path: Path, marker: str) -> None:
    """No teardown at all: `local up` is SIGKILLed. Its children get SIGTERM from the kernel (their
    parent-death signal) and its watchdog stops whatever is left, then removes the directory."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    out = tmp_path / "out.txt"
    env = {**os.environ, MARKER_VAR: marker, "TMPDIR": str(scratch)}
    argv = [str(LEASEWORKER), "local", "up", "--no-auto-faults", "--no-replays"]
    with out.open("wb") as sink:
        up = subprocess.Popen(
            [*argv, "--workers", "2", "--connections", "4"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + UP_S
        while "all 4 connections owned" not in out.read_text():
            assert up.poll() is None, out.read_text()
            assert time.monotonic() < deadline, f"not up within {UP_S} s:\n{out.read_text()}"
            time.sleep(0.2)
        assert len(processes_with_marker(marker)) >= 8  # the 7 of the fleet and the watchdog
        up.kill()
        up.wait()
        killed = time.monotonic()
        while processes_with_marker(marker) or any(scratch.iterdir()):
            if time.monotonic() - killed > GONE_S:
                break
            time.sleep(0.2)
        gone_s = time.monotonic() - killed
    finally:
        up.kill()
        up.wait()
    left = processes_with_marker(marker)
    print(f"SIGKILL of local up → every process gone and the directory removed in {gone_s:.2f} s")
    assert left == [], [_describe(pid) for pid in left]
    assert list(scratch.iterdir()) == [], "temporary directory left behind"
