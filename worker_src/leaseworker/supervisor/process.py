"""Run one child the way tini does: forward signals, reap every zombie, report how the child ended.

The model is krallin/tini (`tini.c`): the supervisor blocks the signals it cares about and takes
them synchronously with `sigtimedwait`, so no handler can race with `waitpid`; the child gets the
original signal mask back before `exec`. Unlike tini, the child stays in the supervisor's process
group: killing that group is the "whole host died" case (docs/design.md §2e), which must take the lease
path, and on Linux the child also dies with SIGKILL if the supervisor itself is killed.

This module imports only the standard library (and `ctypes` on Linux), so the supervisor stays
small; nothing here touches the network.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

# What tini forwards that a worker may act on. SIGCHLD is watched, not forwarded.
FORWARDED_SIGNALS = frozenset(
    {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2}
)
WATCHED_SIGNALS = FORWARDED_SIGNALS | {signal.SIGCHLD}
# How often the wait loop reaps even without a SIGCHLD (tini's safety net, also 1 s).
REAP_INTERVAL_SECONDS = 1.0
# Python ignores these at start-up and an exec keeps ignored dispositions: give the child defaults.
_RESET_IN_CHILD = (signal.SIGPIPE, signal.SIGXFSZ)
_PR_SET_PDEATHSIG = 1
EXIT_SPAWN_FAILED = 127  # the shells' "command not found / not executable"
# The worker refused to start (its lease table is missing or unreachable, worker/start_check.py)
# before it wrote anything: there is no session to fence. 78 is sysexits' EX_CONFIG.
EXIT_NOT_STARTED = 78


class ChildExit(NamedTuple):
    """How the child ended, as waitpid reported it: exactly one of `code` and `signal` is set."""

    code: int | None
    signal: int | None

    @classmethod
    def from_wait_status(cls, status: int) -> ChildExit:
        if os.WIFSIGNALED(status):
            return cls(code=None, signal=os.WTERMSIG(status))
        return cls(code=os.WEXITSTATUS(status), signal=None)

    @property
    def status(self) -> int:
        """The supervisor's own exit status: the child's code, or 128 + the signal (like a shell)."""
        return self.code if self.code is not None else 128 + (self.signal or 0)

    @property
    def clean(self) -> bool:
        """Only status 0 means the worker finished its ordered shutdown (docs/design.md §3, step 7).

        Everything else is a confirmed death: a signal (SIGKILL, the OOM killer, a crash in a C
        extension), a non-zero status, and also a forwarded SIGTERM that still ended non-zero.
        """
        return self.code == 0

    def describe(self) -> str:
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            return f"killed by {name}"
        return f"exited with status {self.code}"


class SpawnError(OSError):
    """The child could not be started (its program is missing or not executable)."""


def block_watched_signals() -> set[int | signal.Signals]:
    """Block what the supervisor waits for; returns the previous mask, which the child gets back.

    Call it once, first. The signals stay blocked until the supervisor exits, so a second SIGTERM
    arriving while a dead child is being fenced waits instead of cutting the fence short."""
    return signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED_SIGNALS)


def spawn(argv: Sequence[str], env: Mapping[str, str], *, child_mask: set[int | signal.Signals]) -> int:
    """Fork and exec `argv` with `env`; returns the child's pid, or raises SpawnError."""
    set_death_signal = _parent_death_signal_setter()
    parent = os.getpid()
    read_end, write_end = os.pipe()  # both close on exec: an empty read means the exec worked
    pid = os.fork()
    if pid == 0:  # the child: never returns into the supervisor's code
        try:
            os.close(read_end)
            signal.pthread_sigmask(signal.SIG_SETMASK, child_mask)
            for signum in _RESET_IN_CHILD:
                signal.signal(signum, signal.SIG_DFL)
            if set_death_signal is not None:
                set_death_signal()
                if os.getppid() != parent:  # the supervisor died before the setting took effect
                    os._exit(128 + signal.SIGKILL)
            os.execvpe(argv[0], list(argv), dict(env))
        except BaseException as error:
            os.write(write_end, f"cannot start {argv[0]!r}: {error}".encode(errors="replace"))
        finally:
            os._exit(EXIT_SPAWN_FAILED)
    os.close(write_end)
    try:
        failure = os.read(read_end, 4096)
    finally:
        os.close(read_end)
    if failure:
        os.waitpid(pid, 0)
        raise SpawnError(failure.decode(errors="replace"))
    return pid


def wait_for_exit(pid: int) -> ChildExit:
    """Forward every watched signal to `pid` and reap every zombie until `pid` itself has exited.

    A stopped (SIGSTOP) or hung child never ends this wait: only an exit that waitpid reports
    does, which is what makes the supervisor's fence a confirmed death rather than a suspicion."""
    while True:
        info = signal.sigtimedwait(WATCHED_SIGNALS, REAP_INTERVAL_SECONDS)
        if info is not None and info.si_signo in FORWARDED_SIGNALS:
            forward(pid, info.si_signo)
        status = reap_zombies(pid)
        if status is not None:
            return ChildExit.from_wait_status(status)


def forward(pid: int, signum: int) -> None:
    """Pass `signum` on. It never raises: a supervisor that died here would orphan the child (a
    process-group SIGSTOP/SIGCONT once made kill() fail with EINVAL and took the supervisor down,
    turning a paused worker's exit 3 into the supervisor's own traceback and exit 1)."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass  # it has just exited: the next reap reports it
    except OSError as error:
        os.write(2, f"supervisor: could not forward signal {signum} to {pid}: {error}\n".encode())


def reap_zombies(child: int) -> int | None:
    """Reap every exited descendant (as PID 1 we inherit orphans); the child's wait status if it
    was among them."""
    found: int | None = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        if pid == child:
            found = status


def child_pids(supervisor_pid: int) -> list[int]:
    """The supervisor's children, from /proc (Linux): how the local fleet finds the worker child
    to kill it alone (an OOM-like death) rather than the whole group (a host-like death)."""
    path = f"/proc/{supervisor_pid}/task/{supervisor_pid}/children"
    try:
        with open(path) as listing:
            return [int(pid) for pid in listing.read().split()]
    except FileNotFoundError:
        return []


def _parent_death_signal_setter() -> Callable[[], None] | None:
    """On Linux, a call that makes the kernel SIGKILL the calling process when its parent dies.

    Resolved before the fork, so the child only makes the system call."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # only here: a supervisor elsewhere does without

    libc = ctypes.CDLL(None, use_errno=True)

    def set_death_signal() -> None:
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")

    return set_death_signal
