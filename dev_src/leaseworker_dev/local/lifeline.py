"""The local fleet never outlives `leaseworker local up`, however that process ends.

Three layers, each covering what the one before cannot:

1. The orderly teardown (local/demo.py): q, Ctrl-C, SIGTERM, SIGHUP, the end of --duration, an
   error, and the terminal going away (its writes fail with EIO; they are never allowed to stop
   the teardown) all stop every child by pid and remove the temporary directory.
2. A parent-death signal (Linux `prctl(PR_SET_PDEATHSIG)`, set in each child between fork and
   exec, `parent_death_signal()`): if `local up` dies without a teardown (SIGKILL, the OOM
   killer, a crash), the kernel sends every direct child SIGTERM. A supervisor forwards it to its
   worker child, which also dies with its supervisor. The signal follows the *thread* that
   forked: children are given one only when forked from the main thread, which lives as long as
   the process.
3. A watchdog process (`python -m leaseworker_dev.local.lifeline`, `Lifeline`), in its own session
   so that no terminal signal reaches it. It holds the read end of a pipe whose only write end is
   `local up`'s: the pipe reads end-of-file the moment `local up` is gone, for whatever reason.
   The watchdog then stops every process that carries this run's `LEASEWORKER_LOCAL_FLEET`
   token in its environment (everything the fleet started inherits it, the worker children
   too): SIGTERM, then SIGKILL after `SWEEP_GRACE_S`. Then it removes the temporary directory
   (never a --root directory). After an orderly teardown it finds nothing and exits at once.

Not covered: a SIGKILL of `local up` *and* of the watchdog together (the children still get
their SIGTERM from the kernel, but the temporary directory stays), and platforms without
`/proc` and `prctl` (only layer 1 works there).

This module imports only the standard library: the watchdog must start fast and stay small.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

FLEET_VAR: Final = "LEASEWORKER_LOCAL_FLEET"
# A worker's ordered shutdown takes up to SHUTDOWN_GRACE_SECONDS (FAST: 10 s), plus a margin.
SWEEP_GRACE_S: Final = 12.0
WATCHDOG_EXIT_S: Final = SWEEP_GRACE_S + 3.0  # the sweep, when an orderly teardown left something
_PR_SET_PDEATHSIG: Final = 1


def parent_death_signal(signum: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` that has the kernel send `signum` to the child when this process dies, or
    None where that is not possible (not Linux; not the main thread, whose exit would fire it).

    The C function is resolved before the fork, so the child only makes two system calls. If this
    process died before the call took effect, the child is reparented: it then exits at once."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def set_death_signal() -> None:
        if prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:
            os._exit(128 + signum)

    return set_death_signal


class Lifeline:
    """While entered: every process started from here carries a fresh fleet token, and a watchdog
    stops them (and removes `remove`, if given) once this process is gone."""

    def __init__(self, remove: Path | None = None) -> None:
        self.token = uuid.uuid4().hex
        self.remove = remove
        self._write_end = -1
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._previous: str | None = None

    def __enter__(self) -> Lifeline:
        self._previous = os.environ.get(FLEET_VAR)
        os.environ[FLEET_VAR] = self.token
        read_end, self._write_end = os.pipe()  # both close-on-exec: no other child holds them
        argv = [sys.executable, "-m", "leaseworker_dev.local.lifeline", "--fd", str(read_end)]
        argv += ["--token", self.token, "--parent", str(os.getpid())]
        if self.remove is not None:
            argv += ["--remove", str(self.remove)]
        try:
            self._watchdog = subprocess.Popen(
                argv,
                pass_fds=(read_end,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # no SIGHUP or Ctrl-C from the terminal
            )
        finally:
            os.close(read_end)
        return self

    def __exit__(self, *exc: object) -> None:
        """An orderly end: the watchdog sweeps (finding nothing, normally) and exits; wait for it,
        so that nothing of this run is left when `local up` returns."""
        if self._previous is None:
            os.environ.pop(FLEET_VAR, None)
        else:
            os.environ[FLEET_VAR] = self._previous
        os.close(self._write_end)
        if self._watchdog is not None:
            try:
                self._watchdog.wait(WATCHDOG_EXIT_S)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
                self._watchdog.wait()


# ---------------------------------------------------------------------------- the watchdog


def fleet_processes(token: str, exclude: Sequence[int] = ()) -> list[int]:
    """Live (not zombie) pids whose environment carries FLEET_VAR=token, from /proc."""
    needle = f"{FLEET_VAR}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def sweep(token: str, exclude: Sequence[int], grace_s: float = SWEEP_GRACE_S) -> list[int]:
    """SIGTERM every process of the fleet, SIGKILL what is left after `grace_s`; the pids found."""
    found = fleet_processes(token, exclude)
    for pid in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while fleet_processes(token, exclude) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in fleet_processes(token, exclude):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return found


def watch(fd: int, token: str, parent: int, remove: Path | None) -> None:
    """Block until `fd` reads end-of-file (`local up` is gone), then stop the fleet and remove."""
    while os.read(fd, 512):
        pass
    sweep(token, exclude=(os.getpid(), parent))
    if remove is not None:
        shutil.rmtree(remove, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m leaseworker_dev.local.lifeline", description=__doc__)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--remove", type=Path, default=None)
    args = parser.parse_args(argv)
    for signum in (signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
    watch(args.fd, args.token, args.parent, args.remove)
    return 0


if __name__ == "__main__":
    sys.exit(main())
