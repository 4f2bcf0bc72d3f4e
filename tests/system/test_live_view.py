"""Drive `leaseworker local up`'s live view in a pseudo-terminal, as a person at a keyboard would.

It must draw the workers and the connections, react to a key (k: SIGKILL the busiest worker, and
the takeover appears with its measured time), and on Ctrl-C stop everything it started and exit 0.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pexpect

from tests.system.procscan import MARKER_VAR, processes_with_marker

LEASEWORKER = Path(sys.executable).with_name("leaseworker")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Screen:
    """The terminal output with styling stripped; `expect` searches what came after the last match."""

    def __init__(self, child: pexpect.spawn) -> None:
        self.child = child
        self.text = ""
        self.pos = 0

    def expect(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        compiled = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            match = compiled.search(self.text, self.pos)
            if match:
                self.pos = match.end()
                return match
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no {pattern!r} within {timeout} s; screen ends with {self.text[-1500:]!r}"
                )
            try:
                chunk = self.child.read_nonblocking(65536, timeout=0.5)
            except pexpect.TIMEOUT:
                continue
            except pexpect.EOF:
                if compiled.search(self.text, self.pos):
                    continue
                raise AssertionError(
                    f"exited before {pattern!r}; output ends with {self.text[-1500:]!r}"
                ) from None
            self.text += ANSI.sub("", chunk)


def test_live_view_keys_and_ctrl_c(tmp_path: Path, marker: str) -> None:
    env = {**os.environ, MARKER_VAR: marker, "TERM": "xterm-256color"}
    child = pexpect.spawn(
        str(LEASEWORKER),
        ["local", "up", "--no-auto-faults", "--workers", "3", "--connections", "6", "--root", str(tmp_path)],
        env=env,
        dimensions=(40, 160),
        encoding="utf-8",
        timeout=60,
    )
    screen = Screen(child)
    try:
        screen.expect("worker +pid +status +owned +msg/s")
        screen.expect("connection +state +owner +epoch +last_seq +lag")
        screen.expect(r"feed-0\d +STARTED +w\d +1 ")  # a connection row with an owner at epoch 1
        screen.expect("all 6 connections owned")
        running = processes_with_marker(marker)
        assert len(running) >= 6, running  # DynamoDB Local, moto, the feed, three workers

        child.send("k")
        victim = screen.expect(r"SIGKILL (w\d) \(held").group(1)
        screen.expect(rf"{victim}: \d+ connections taken over, max \d+\.\d\d s \(within", timeout=30)
        screen.expect(rf"{victim} +\d+ +killed")  # the worker table shows it

        child.sendintr()  # Ctrl-C, through the terminal's line discipline
        screen.expect(r"stopping \d+ processes by pid", timeout=10)
        screen.expect("stopped: every process this command started has exited", timeout=40)
        child.expect(pexpect.EOF, timeout=10)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)

    deadline = time.monotonic() + 5
    while processes_with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with_marker(marker) == []
