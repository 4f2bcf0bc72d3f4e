"""Find processes left behind, without psutil: every descendant inherits a marker variable."""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from pathlib import Path

MARKER_VAR = "LEASEWORKER_TEST_RUN"


def new_marker() -> str:
    return uuid.uuid4().hex


def processes_with_marker(marker: str) -> list[int]:
    """Pids of live (non-zombie) processes whose environment carries MARKER_VAR=marker."""
    needle = f"{MARKER_VAR}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def reap(marker: str) -> None:
    """SIGKILL whatever still carries the marker: a failed test must not leak a fleet into CI."""
    for pid in processes_with_marker(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
