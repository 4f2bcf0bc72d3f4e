"""The supervisor (docs/design.md §2e): exit classification, signal forwarding, reaping, exit status.

No DynamoDB here: a child that ends cleanly needs none, and the fence itself is tested against
DynamoDB Local in tests/system/test_supervisor.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from leaseworker.cli.run import child_argv, supervisor_argv
from leaseworker.notify import encode_message
from leaseworker.supervisor.fence import COND_CONFIRM_FENCE, encode_hint
from leaseworker.supervisor.main import parse_args
from leaseworker.supervisor.process import FORWARDED_SIGNALS, ChildExit, child_pids

# A child that records every forwarded signal it gets, one name a line; it exits on SIGTERM
# with $EXIT_ON_TERM (default 0), or at once with $EXIT_AT_START when that is set.
RECORDING_CHILD = """
import os, signal, sys, time
log = sys.argv[1]
def record(signum, frame):
    with open(log, "a") as out:
        out.write(signal.Signals(signum).name + "\\n")
    if signum == signal.SIGTERM:
        sys.exit(int(os.environ.get("EXIT_ON_TERM", "0")))
for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"):
    signal.signal(getattr(signal, name), record)
if os.environ.get("EXIT_AT_START"):
    sys.exit(int(os.environ["EXIT_AT_START"]))
with open(log, "a") as out:
    out.write(f"ready {os.getpid()}\\n")
while True:
    time.sleep(0.05)
"""
# Nothing listens on port 9 of loopback: a fence attempt fails fast instead of reaching anything.
UNREACHABLE = "http://127.0.0.1:9"


# ------------------------------------------------------------------ classification (pure)


@pytest.mark.parametrize(
    ("wait_status", "expected", "status", "clean", "says"),
    [
        (0, ChildExit(code=0, signal=None), 0, True, "exited with status 0"),
        (3 << 8, ChildExit(code=3, signal=None), 3, False, "exited with status 3"),
        (1 << 8, ChildExit(code=1, signal=None), 1, False, "exited with status 1"),
        (signal.SIGKILL, ChildExit(code=None, signal=9), 137, False, "killed by SIGKILL"),
        (signal.SIGTERM, ChildExit(code=None, signal=15), 143, False, "killed by SIGTERM"),
        (signal.SIGSEGV | 0x80, ChildExit(code=None, signal=11), 139, False, "killed by SIGSEGV"),
    ],
)
def test_exit_classification(
    wait_status: int, expected: ChildExit, status: int, clean: bool, says: str
) -> None:
    """Only status 0 is clean; a signal (SIGKILL, the OOM killer, a core dump) or any non-zero
    status, a forwarded SIGTERM's included, is a confirmed death; the status is a shell's."""
    ended = ChildExit.from_wait_status(wait_status)
    assert ended == expected
    assert ended.status == status
    assert ended.clean is clean
    assert ended.describe() == says


def test_wait_statuses_come_from_real_processes() -> None:
    """The hand-made statuses above are what the kernel really reports."""
    killed = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), 9)"])
    assert killed.wait() == -9
    exited = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    assert exited.wait() == 3
    assert ChildExit(code=None, signal=-killed.returncode).status == 137
    assert ChildExit(code=exited.returncode, signal=None).status == 3


def test_arguments() -> None:
    assert parse_args(["--", "python", "-V"]) == (False, ["python", "-V"])
    assert parse_args(["--preload-clients", "--", "x"]) == (True, ["x"])
    assert parse_args(["python"]) is None
    assert parse_args(["--"]) is None
    assert parse_args(["--bogus", "--", "x"]) is None


def test_leaseworker_run_starts_the_supervisor_with_its_fence_clients_preloaded() -> None:
    # Loaded after a death, botocore's import cost 0.45-0.8 s of the fast takeover (cli/run.py).
    argv = supervisor_argv(child_argv())
    assert argv[1:3] == ["-m", "leaseworker.supervisor"]
    assert parse_args(argv[3:]) == (True, child_argv())


def test_hint_is_the_notifiers_wire_form() -> None:
    assert encode_hint("conn-1") == encode_message("conn-1")


def test_fence_never_creates_an_item_nor_overrides_another_fence() -> None:
    assert "attribute_not_exists(fenced_by)" in COND_CONFIRM_FENCE
    assert "attribute_exists(connection_id)" in COND_CONFIRM_FENCE


# ------------------------------------------------------------------ the real process


class Supervised:
    """`python -m leaseworker.supervisor -- python RECORDING_CHILD LOG`, observed from outside."""

    def __init__(self, tmp_path: Path, **env: str) -> None:
        self.log = tmp_path / "signals.log"
        script = tmp_path / "child.py"
        script.write_text(RECORDING_CHILD)
        environment = {
            **os.environ,
            "WORKER_ID": "unit-sup",
            "AWS_ENDPOINT_URL_DYNAMODB": UNREACHABLE,
            "AWS_REGION": "us-east-1",
            **env,
        }
        self.popen = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "leaseworker.supervisor",
                "--",
                sys.executable,
                str(script),
                str(self.log),
            ],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def received(self, name: str) -> Callable[[], bool]:
        return lambda: name in self.lines()

    def child_pid(self) -> int:
        wait_for(lambda: any(line.startswith("ready ") for line in self.lines()), "the child to start")
        return int(next(line for line in self.lines() if line.startswith("ready ")).split()[1])

    def finish(self, timeout: float = 15) -> tuple[int, str]:
        _, stderr = self.popen.communicate(timeout=timeout)
        return self.popen.returncode, stderr


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[Callable[..., Supervised]]:
    started: list[Supervised] = []

    def start(**env: str) -> Supervised:
        started.append(Supervised(tmp_path, **env))
        return started[-1]

    yield start
    for each in started:
        if each.popen.poll() is None:
            each.popen.kill()  # the child follows: it has the supervisor's death signal
            each.popen.communicate()


def test_signals_are_forwarded_and_a_clean_exit_is_the_supervisors(
    supervised: Callable[..., Supervised],
) -> None:
    sup = supervised()
    sup.child_pid()
    order = [signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGQUIT]
    assert set(order) | {signal.SIGTERM} == FORWARDED_SIGNALS
    for signum in order:
        sup.popen.send_signal(signum)
        wait_for(sup.received(signum.name), f"the child to receive {signum.name}")
    sup.popen.send_signal(signal.SIGTERM)
    status, stderr = sup.finish()
    assert sup.lines()[1:] == [s.name for s in order] + ["SIGTERM"]
    assert status == 0
    assert "fence" not in stderr  # a clean exit needs nothing more


@pytest.mark.parametrize(("env", "status"), [({"EXIT_ON_TERM": "3"}, 3), ({}, 137)])
def test_the_childs_status_is_the_supervisors(
    supervised: Callable[..., Supervised], env: dict[str, str], status: int
) -> None:
    """A SIGTERM-forwarded child that still exits non-zero, or a killed child, is a death: the
    supervisor tries the fence (nothing listens here, so it reports the failure) and exits with
    the child's status all the same."""
    sup = supervised(**env)
    child = sup.child_pid()
    if env:
        sup.popen.send_signal(signal.SIGTERM)
    else:
        os.kill(child, signal.SIGKILL)
    code, stderr = sup.finish()
    assert code == status
    assert '"session fenced' not in stderr
    assert "worker child died" in stderr
    assert "EndpointConnectionError" in stderr


def test_a_stopped_child_is_waited_for_not_judged(supervised: Callable[..., Supervised]) -> None:
    """SIGSTOP is not an exit: the supervisor keeps waiting (past several reap rounds)."""
    sup = supervised()
    child = sup.child_pid()
    os.kill(child, signal.SIGSTOP)
    time.sleep(2.5)  # more than two REAP_INTERVAL_SECONDS rounds: nothing may happen meanwhile
    assert sup.popen.poll() is None
    os.kill(child, signal.SIGCONT)
    sup.popen.send_signal(signal.SIGTERM)
    status, stderr = sup.finish()
    assert status == 0
    assert "worker child died" not in stderr


def test_the_child_dies_with_the_supervisor(supervised: Callable[..., Supervised]) -> None:
    """A killed supervisor (locally: not PID 1) must not leave a live worker behind."""
    sup = supervised()
    child = sup.child_pid()
    assert child_pids(sup.popen.pid) == [child]
    sup.popen.kill()
    sup.finish()
    wait_for(lambda: not _alive(child), "the orphaned child to die")


def test_a_missing_program_is_one_line_and_127(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "leaseworker.supervisor", "--", str(tmp_path / "nope")],
        env={**os.environ, "WORKER_ID": "unit-sup"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 127
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("error: cannot start")


def test_without_worker_id_nothing_starts(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    env = {k: v for k, v in os.environ.items() if k != "WORKER_ID"}
    done = subprocess.run(
        [sys.executable, "-m", "leaseworker.supervisor", "--", "touch", str(marker)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert "WORKER_ID" in done.stderr
    assert not marker.exists()


def test_every_exited_descendant_is_reaped(tmp_path: Path) -> None:
    """As PID 1 the supervisor inherits orphans: reap_zombies collects all of them, and reports
    the status of its own child among them. (Run in a fresh process: waitpid(-1) in pytest's own
    process could steal another fixture's child.)"""
    script = """
import os, sys, time
from leaseworker.supervisor.process import reap_zombies
others = [os.posix_spawn("/bin/sh", ["sh", "-c", "exit 0"], os.environ) for _ in range(3)]
mine = os.posix_spawn("/bin/sh", ["sh", "-c", "exit 7"], os.environ)
time.sleep(0.5)
status = reap_zombies(mine)
print(os.waitstatus_to_exitcode(status), end=" ")
try:
    os.waitpid(-1, os.WNOHANG)
    print("left")
except ChildProcessError:
    print("none-left")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=True
    )
    assert done.stdout.split() == ["7", "none-left"]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"
