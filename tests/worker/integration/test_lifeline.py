"""The local fleet's lifeline (leaseworker_dev.local.lifeline), with plain `sleep` processes for a fleet:
a parent-death signal reaches a child when its parent is SIGKILLed, and the watchdog stops what
carries the run's token and removes the directory once the parent is gone, or exits at once after
an orderly end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from leaseworker_dev.local.lifeline import FLEET_VAR, Lifeline, fleet_processes, parent_death_signal
from tests.system.procscan import alive

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl and /proc: Linux")

# A parent that starts a `sleep` the way the fleet starts its children, prints its pid and waits.
PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    from pathlib import Path
    from leaseworker_dev.local.lifeline import Lifeline, parent_death_signal
    with Lifeline(remove=Path(sys.argv[1]) if sys.argv[1] else None):
        use_signal = sys.argv[2] == "signal"
        child = subprocess.Popen(
            ["sleep", "600"], start_new_session=True,
            preexec_fn=parent_death_signal() if use_signal else None,
        )
        print(child.pid, flush=True)
        time.sleep(600)
    """
)


def _until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _start(directory: str, mode: str) -> tuple[subprocess.Popen[str], int]:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, directory, mode], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    return parent, int(parent.stdout.readline())


@pytest.mark.parametrize("mode", ["signal", "watchdog"])
def test_a_sigkilled_parent_leaves_no_child_and_no_directory(tmp_path: Path, mode: str) -> None:
    """`signal`: the child has a parent-death signal (and the watchdog is there too);
    `watchdog`: it has none, so only the watchdog can stop it."""
    directory = tmp_path / "fleet"
    directory.mkdir()
    (directory / "log").write_text("x")
    parent, child = _start(str(directory), mode)
    try:
        assert alive(child)
        parent.kill()
        parent.wait()
        assert _until(lambda: not alive(child), 5.0), "the child outlived its parent"
        assert _until(lambda: not directory.exists(), 5.0), "the directory was left"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_without_the_lifeline_the_child_outlives_its_parent(tmp_path: Path) -> None:
    """The control: the same child, no death signal, no watchdog (the token alone does nothing)."""
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, time\n"
            "c = subprocess.Popen(['sleep', '600'], start_new_session=True)\nprint(c.pid, flush=True)\n"
            "time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        parent.kill()
        parent.wait()
        assert not _until(lambda: not alive(child), 1.0)
    finally:
        os.kill(child, signal.SIGKILL)


def test_an_orderly_end_waits_for_the_watchdog_and_keeps_a_root(tmp_path: Path) -> None:
    """The watchdog exits with the lifeline, finding nothing; a directory it was not told to
    remove (a --root) stays; the token is gone from the environment afterwards."""
    began = time.monotonic()
    with Lifeline(remove=None) as lifeline:
        assert os.environ[FLEET_VAR] == lifeline.token
        watchdog = lifeline._watchdog
        assert watchdog is not None and watchdog.poll() is None
    assert watchdog.returncode == 0
    assert time.monotonic() - began < 5.0
    assert FLEET_VAR not in os.environ
    assert fleet_processes(lifeline.token) == []


def test_the_death_signal_is_only_given_from_the_main_thread() -> None:
    import threading

    found: list[object] = []
    thread = threading.Thread(target=lambda: found.append(parent_death_signal()))
    thread.start()
    thread.join()
    assert found == [None]  # the thread's exit would fire it
    assert parent_death_signal() is not None
