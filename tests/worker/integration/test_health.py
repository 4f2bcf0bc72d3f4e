"""The health file and `leaseworker health` (docs/design.md §8): healthy only for a live worker that
heartbeats, never for a stale, stopping, dead or unreadable one."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from leaseworker.health import (
    DEFAULT_HEALTH_DIR,
    HEALTH_FILE_ENV,
    HealthFile,
    default_health_file,
    fleet_of,
    health_file_path,
    judge,
    stale_after_seconds,
)

LEASEWORKER = Path(sys.executable).with_name("leaseworker")
NOW = 1000.0


def record(**overrides: object) -> str:
    content: dict[str, object] = {
        "state": "running",
        "worker_id": "w1",
        "pid": 42,
        "monotonic": NOW - 1.0,
        "wall_ms": 0,
        "heartbeat_seconds": 5.0,
        "lease_seconds": 20.0,
    }
    content.update(overrides)
    return json.dumps(content)


def alive(pid: int) -> bool:
    return True


def dead(pid: int) -> bool:
    return False


def test_stale_after_is_the_longer_of_three_heartbeats_and_one_lease() -> None:
    assert stale_after_seconds(5, 20) == 20
    assert stale_after_seconds(10, 20) == 30


@pytest.mark.parametrize(
    ("content", "is_alive", "ok", "says"),
    [
        (record(), alive, True, "worker w1 (pid 42) heartbeat 1.0 s ago"),
        (record(monotonic=NOW - 19.9), alive, True, "heartbeat 19.9 s ago"),
        (record(monotonic=NOW - 20.1), alive, False, "was 20.1 s ago (limit 20 s)"),
        (record(monotonic=NOW - 29.0, heartbeat_seconds=10.0), alive, True, "29.0 s ago"),
        (record(state="stopping"), alive, False, "is shutting down"),
        (record(), dead, False, "worker w1 (pid 42) is not running"),
        (record(monotonic=NOW + 60), alive, False, "from another boot"),
        (record(state="paused"), alive, False, "unknown state 'paused'"),
        (record(pid="x"), alive, False, "not a worker's health record"),
        ('{"state": "running"}', alive, False, "not a worker's health record (KeyError"),
        ("{trunc", alive, False, "not a worker's health record (JSONDecodeError"),
        ("[]", alive, False, "not a worker's health record (TypeError"),
    ],
)
def test_judge(content: str, is_alive: Callable[[int], bool], ok: bool, says: str) -> None:
    verdict, reason = judge(content, NOW, is_alive=is_alive)
    assert verdict is ok
    assert says in reason
    assert "\n" not in reason


def test_the_path_comes_from_the_environment() -> None:
    assert health_file_path({HEALTH_FILE_ENV: "/x/h.json"}) == Path("/x/h.json")
    assert HealthFile.from_env({HEALTH_FILE_ENV: "/x/h.json"}).path == Path("/x/h.json")
    default = health_file_path({})
    assert default.parent == Path(DEFAULT_HEALTH_DIR) == Path("/tmp/leaseworker")
    assert re.fullmatch(r"health-[0-9a-f]{16}\.json", default.name), default


def test_the_default_path_is_one_fleets_and_one_users() -> None:
    """Another checkout's fleet (another endpoint), another table, region or user: another file.
    The same environment (the worker's and its container's health check): the same file."""
    base = {
        "TABLE_NAME": "t",
        "AWS_ENDPOINT_URL_DYNAMODB": "http://127.0.0.1:8000",
        "AWS_REGION": "eu-west-1",
    }
    same = default_health_file(dict(base), uid=1000)
    assert default_health_file(dict(base), uid=1000) == same
    # AWS_ENDPOINT_URL and AWS_DEFAULT_REGION count as the worker's settings read them.
    alias = {
        "TABLE_NAME": "t",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:8000",
        "AWS_DEFAULT_REGION": "eu-west-1",
    }
    assert default_health_file(alias, uid=1000) == same
    others = [
        {**base, "AWS_ENDPOINT_URL_DYNAMODB": "http://127.0.0.1:8001"},
        {**base, "TABLE_NAME": "u"},
        {**base, "AWS_REGION": "us-east-1"},
    ]
    paths = {default_health_file(env, uid=1000) for env in others} | {default_health_file(base, uid=1001)}
    assert same not in paths and len(paths) == 4
    assert fleet_of(base) == {"table": "t", "endpoint": "http://127.0.0.1:8000", "region": "eu-west-1"}
    assert fleet_of({})["table"] == "leaseworker-connections" and fleet_of({})["endpoint"] == ""


def test_judge_refuses_another_fleets_worker() -> None:
    mine = {"table": "t", "endpoint": "http://127.0.0.1:8000", "region": "us-east-1"}
    theirs = {**mine, "endpoint": "http://127.0.0.1:9000"}
    ok, reason = judge(record(fleet=mine), NOW, is_alive=alive, fleet=mine)
    assert ok, reason
    assert "worker w1 (pid 42) of table t at http://127.0.0.1:8000 in us-east-1 heartbeat 1.0 s ago" in reason
    ok, reason = judge(record(fleet=theirs), NOW, is_alive=alive, fleet=mine)
    assert not ok
    assert reason == (
        "the health file is worker w1 (pid 42)'s, of table t at http://127.0.0.1:9000 in us-east-1, "
        "not of table t at http://127.0.0.1:8000 in us-east-1"
    )
    assert not judge(record(), NOW, is_alive=alive, fleet=mine)[0]  # a record that names no fleet
    assert judge(record(fleet=theirs), NOW, is_alive=alive)[0]  # an explicit file: judged as it is


def test_beat_writes_atomically_into_a_new_directory(tmp_path: Path) -> None:
    path = tmp_path / "new" / "dir" / "health.json"
    clock = iter([500.0, 503.0])
    health = HealthFile(path, clock=lambda: next(clock))
    health.beat(worker_id="w7", heartbeat_seconds=1.0, lease_seconds=3.0)
    written = json.loads(path.read_text())
    assert written["state"] == "running"
    assert written["worker_id"] == "w7"
    assert written["pid"] == os.getpid()
    assert written["monotonic"] == 500.0
    assert (written["heartbeat_seconds"], written["lease_seconds"]) == (1.0, 3.0)
    assert judge(path.read_text(), 502.9)[0]
    assert not judge(path.read_text(), 503.1)[0]

    health.stopping()
    stopped = json.loads(path.read_text())
    assert (stopped["state"], stopped["worker_id"], stopped["monotonic"]) == ("stopping", "w7", 503.0)
    assert os.listdir(path.parent) == ["health.json"]  # no temporary file left behind

    health.beat(worker_id="w7", heartbeat_seconds=1.0, lease_seconds=3.0)  # renewals go on
    assert json.loads(path.read_text())["state"] == "stopping"


def test_a_failing_write_never_raises_and_logs_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    health = HealthFile(blocker / "health.json")  # its directory cannot exist
    for _ in range(3):
        health.beat(worker_id="w1", heartbeat_seconds=1.0, lease_seconds=3.0)
    health.stopping()
    logged = capsys.readouterr().out
    assert logged.count("cannot write the health file") == 1, logged


def health_cli(path: Path, *, via_env: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, HEALTH_FILE_ENV: str(path)} if via_env else None
    argv = [str(LEASEWORKER), "health"] + ([] if via_env else ["--file", str(path)])
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)


def assert_unhealthy(done: subprocess.CompletedProcess[str], says: str) -> None:
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("unhealthy: ") and says in line, line


# A stand-in for the worker: it beats every 0.1 s as the heartbeat loop would, and on SIGTERM
# records that it is stopping and lingers, as a worker does while it hands its connections over.
FAKE_WORKER = textwrap.dedent(
    """
    import signal, sys, time
    from leaseworker.health import HealthFile
    health = HealthFile(sys.argv[1])
    stopping = False
    def on_term(signum, frame):
        global stopping
        stopping = True
    signal.signal(signal.SIGTERM, on_term)
    while not stopping:
        health.beat(worker_id="fake", heartbeat_seconds=0.1, lease_seconds=30.0)
        time.sleep(0.1)
    health.stopping()
    time.sleep(30)
    """
)


def test_health_cli_for_a_live_then_stopping_then_dead_worker(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    worker = subprocess.Popen([sys.executable, "-c", FAKE_WORKER, str(path)])
    try:
        deadline = time.monotonic() + 10
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        done = health_cli(path, via_env=True)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("healthy: worker fake (pid ")

        worker.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while json.loads(path.read_text())["state"] != "stopping" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert_unhealthy(health_cli(path), "worker fake (pid")
        assert_unhealthy(health_cli(path), "is shutting down")
    finally:
        worker.kill()
        worker.wait()

    content = json.loads(path.read_text())
    # A fresh beat from a dead pid (the 30 s lease keeps the CLI's start-up time out of it).
    content.update(state="running", monotonic=time.monotonic())
    path.write_text(json.dumps(content))
    assert_unhealthy(health_cli(path), "is not running")


def test_health_cli_for_a_stale_missing_or_unreadable_file(tmp_path: Path) -> None:
    stale = tmp_path / "stale.json"
    stale.write_text(record(pid=os.getpid(), monotonic=time.monotonic() - 25.0))
    done = health_cli(stale)
    assert_unhealthy(done, "s ago (limit 20 s)")
    age = re.search(r"last successful heartbeat was ([0-9.]+) s ago", done.stderr)
    assert age is not None and float(age.group(1)) >= 25.0, done.stderr
    assert_unhealthy(health_cli(tmp_path / "missing.json"), "no health file at")
    assert_unhealthy(health_cli(tmp_path), "cannot read the health file")
    fresh = tmp_path / "fresh.json"
    fresh.write_text(record(pid=os.getpid(), monotonic=time.monotonic()))
    assert health_cli(fresh).returncode == 0


# A worker that writes its default health file, as `leaseworker run` does with its environment.
DEFAULT_FILE_WORKER = textwrap.dedent(
    """
    import sys, time
    from leaseworker.health import HealthFile
    health = HealthFile.from_env()
    print(health.path, flush=True)
    while True:
        health.beat(worker_id=sys.argv[1], heartbeat_seconds=0.1, lease_seconds=30.0)
        time.sleep(0.1)
    """
)


def test_health_never_reports_another_fleets_worker_on_a_shared_host() -> None:
    """Two fleets on one host (two checkouts, each with its DynamoDB Local): each one's
    `leaseworker health` judges its own worker, and with no worker of its own says so, instead of
    reporting the other's (the review saw `unhealthy: worker wa (pid 29805) is shutting down` from
    another checkout)."""
    run = uuid.uuid4().hex[:8]
    env = {k: v for k, v in os.environ.items() if k != HEALTH_FILE_ENV and not k.startswith("AWS_ENDPOINT")}
    fleets = {
        name: {
            **env,
            "TABLE_NAME": "leaseworker-connections",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL_DYNAMODB": f"http://fleet-{name}-{run}.invalid:8000",
        }
        for name in ("a", "b")
    }
    worker = subprocess.Popen(
        [sys.executable, "-c", DEFAULT_FILE_WORKER, "wa"], env=fleets["a"], stdout=subprocess.PIPE, text=True
    )
    assert worker.stdout is not None
    path = Path(worker.stdout.readline().strip())
    try:
        deadline = time.monotonic() + 10
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        mine = subprocess.run(
            [str(LEASEWORKER), "health"],
            env=fleets["a"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert mine.returncode == 0, mine.stderr
        assert mine.stdout.startswith(
            f"healthy: worker wa (pid {worker.pid}) of table leaseworker-connections"
        )
        theirs = subprocess.run(
            [str(LEASEWORKER), "health"],
            env=fleets["b"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert_unhealthy(theirs, f"no health file for table leaseworker-connections at http://fleet-b-{run}")
        assert "wa" not in theirs.stderr
    finally:
        worker.kill()
        worker.wait()
        path.unlink(missing_ok=True)
