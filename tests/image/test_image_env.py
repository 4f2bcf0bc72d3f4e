"""The image's environment, built the way worker_src/Dockerfile builds it, and the worker run from it.

STYLE.md §14: test the installed artifact, not the source tree. A fresh venv gets exactly
`pip install -r worker_src/requirements.txt` and then a non-editable `pip install --no-deps` of a
copy of the package (the Dockerfile's COPY; building in place would leave build/ and egg-info in
the source tree). Nothing from the dev venv is visible to it: no type stubs, no moto, no pytest.
Then, from that venv: every shipped module imports, the CLI starts, a bad setting is one line,
`local` says how to get the development package, which is absent, and a worker holds one
connection on DynamoDB Local, writes to the file sink and exits 0 on SIGTERM.

Where a Docker engine exists, the Docker step builds the image itself and runs `--help` in it.

pip's cache is used (a warm cache makes the install take seconds); the figures are printed
(`pytest -s` shows them) for the record, never asserted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[2]
WORKER_SRC = REPO / "worker_src"
DEV_PYTHON = sys.executable  # runs the local feed, which is a dev tool and not part of the image
RUN_SECONDS = 4.0  # how long the worker delivers before SIGTERM, once its first record is in
SHUTDOWN_GRACE_SECONDS = 10


@dataclass(frozen=True)
class ImageEnv:
    root: Path
    python: Path
    leaseworker: Path

    def env(self, **extra: str) -> dict[str, str]:
        """A clean environment: no PYTHONPATH, no AWS profile, local credentials."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(
                ("AWS_", "PYTHON", "OTEL_", "TABLE_NAME", "NOTIFY_", "LEASEWORKER_", "VIRTUAL_ENV")
            )
        }
        env.update(
            {
                "HOME": str(self.root / "home"),
                "AWS_REGION": "us-east-1",
                "AWS_ACCESS_KEY_ID": "local",
                "AWS_SECRET_ACCESS_KEY": "local",
                "AWS_EC2_METADATA_DISABLED": "true",
            }
        )
        env.update(extra)
        return env

    def run(self, *argv: str | Path, timeout: float = 60, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(a) for a in argv],
            env=self.env(**extra),
            cwd=self.root,  # never the source tree: it must not be importable by accident
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def _pip(python: Path, *args: str, cwd: Path) -> float:
    started = time.monotonic()
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--quiet", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return time.monotonic() - started


@pytest.fixture(scope="module")
def image_env(tmp_path_factory: pytest.TempPathFactory) -> ImageEnv:
    root = tmp_path_factory.mktemp("image-env")
    source_tree_before = set(WORKER_SRC.iterdir())  # the dev venv's editable install has its egg-info
    (root / "home").mkdir()
    venv = root / "venv"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # The Dockerfile's two steps: the pinned requirements, then the package (a copy) without deps.
    requirements_seconds = _pip(python, "-r", str(WORKER_SRC / "requirements.txt"), cwd=root)
    app = root / "app"
    app.mkdir()
    shutil.copy(WORKER_SRC / "pyproject.toml", app)
    shutil.copytree(
        WORKER_SRC / "leaseworker", app / "leaseworker", ignore=shutil.ignore_patterns("__pycache__")
    )
    package_seconds = _pip(python, "--no-deps", str(app), cwd=root)
    print(
        f"\nimage env: venv + requirements.txt {requirements_seconds:.1f} s, package --no-deps "
        f"{package_seconds:.1f} s, total {time.monotonic() - started:.1f} s"
    )
    assert set(WORKER_SRC.iterdir()) == source_tree_before  # no build/ or egg-info left behind
    return ImageEnv(root=root, python=python, leaseworker=venv / "bin" / "leaseworker")


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


# Run inside the image venv: import every module it ships, from the installed copy.
IMPORT_ALL = textwrap.dedent(
    """
    import importlib, json, pkgutil, sys, sysconfig
    import leaseworker
    site = sysconfig.get_paths()["purelib"]
    assert leaseworker.__file__.startswith(site), leaseworker.__file__
    imported, failed = ["leaseworker"], {}
    for info in pkgutil.walk_packages(leaseworker.__path__, "leaseworker.", onerror=lambda n: None):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue  # runs the CLI on import; exercised with `python -m` instead
        try:
            importlib.import_module(info.name)
            imported.append(info.name)
        except BaseException as error:
            failed[info.name] = f"{type(error).__name__}: {error}"
    absent = [m for m in ("types_aiobotocore_dynamodb", "moto", "pytest", "pexpect", "mypy_boto3_dynamodb")
              if importlib.util.find_spec(m) is not None]
    print(json.dumps({"imported": imported, "failed": failed, "dev_tools_present": absent}))
    """
)


def test_every_shipped_module_imports_from_the_installed_package(image_env: ImageEnv) -> None:
    done = image_env.run(image_env.python, "-c", IMPORT_ALL)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["failed"] == {}
    assert result["dev_tools_present"] == []  # the environment really is the image's
    shipped = {
        ".".join(p.relative_to(WORKER_SRC).with_suffix("").parts).removesuffix(".__init__")
        for p in (WORKER_SRC / "leaseworker").rglob("*.py")
        if p.name != "__main__.py"
    }
    assert set(result["imported"]) == shipped
    print(f"\nimage env: {len(result['imported'])} modules import")
    check = image_env.run(image_env.python, "-m", "pip", "check")
    assert check.returncode == 0, check.stdout


def test_the_cli_starts_and_lists_its_commands(image_env: ImageEnv) -> None:
    commands: list[list[str | Path]] = [
        [image_env.leaseworker, "--help"],
        [image_env.python, "-m", "leaseworker", "--help"],
    ]
    for argv in commands:
        done = image_env.run(*argv)
        assert done.returncode == 0, done.stderr
        for command in ("run", "health", "connections", "table", "local"):
            assert f"  {command} " in done.stdout, done.stdout


def test_the_development_package_is_absent(image_env: ImageEnv) -> None:
    """The local fleet, the fault suite (and its negative controls) and the replays are not shipped."""
    absent = ("leaseworker_dev", "leaseworker_dev.chaos.unsafe", "leaseworker.local", "leaseworker.chaos")
    for module in absent:
        done = image_env.run(image_env.python, "-c", f"import {module}")
        assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, (module, done.stderr)
    lines = sum(len(p.read_text().splitlines()) for p in (WORKER_SRC / "leaseworker").rglob("*.py"))
    print(f"\nimage package: {lines} lines of Python")


def test_a_bad_setting_is_one_line(image_env: ImageEnv) -> None:
    line = one_line(image_env.run(image_env.leaseworker, "run", LEASE_SECONDS="abc"))
    assert line == "error: invalid LEASE_SECONDS='abc': must be a number", line


def test_local_without_the_development_package_says_how_to_get_it(image_env: ImageEnv) -> None:
    for argv in (["local", "up", "--duration", "1"], ["local", "--help"], ["local"]):
        done = image_env.run(image_env.leaseworker, *argv)
        assert done.returncode == 1, (argv, done)
        line = one_line(done)
        assert "make demo" in line and "pip install -e dev_src" in line, line


@pytest.fixture
def feed(tmp_path: Path) -> Iterator[str]:
    """The local seqfeed/1 upstream, from the dev venv, on a free port."""
    process = subprocess.Popen(
        [DEV_PYTHON, "-m", "leaseworker_dev.feed", "--port", "0", "--rate", "50"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # `{"feed": "ws://127.0.0.1:PORT"}` once listening
        assert line.startswith('{"feed"'), line
        yield str(json.loads(line)["feed"])
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def delivered(sink_file: Path) -> list[dict[str, object]]:
    if not sink_file.exists():
        return []
    return [json.loads(line) for line in sink_file.read_text().splitlines() if line.strip()]


@pytest.fixture
def blackhole() -> Iterator[str]:
    """An OTLP endpoint that accepts connections and never answers: the worst collector outage."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


@dataclass
class WorkerRun:
    code: int
    records: list[dict[str, object]]
    log: str
    first_record_seconds: float
    ran_seconds: float
    shutdown_seconds: float
    health_while_running: subprocess.CompletedProcess[str]
    health_after_exit: subprocess.CompletedProcess[str]


def run_worker(
    image_env: ImageEnv, dynamodb_endpoint: str, feed: str, tmp_path: Path, **extra_env: str
) -> WorkerRun:
    """`leaseworker run` from the image venv: one connection, the file sink, SIGTERM after a while."""
    table = f"image-{uuid.uuid4().hex[:8]}"
    target = ["--endpoint-url", dynamodb_endpoint, "--table", table]
    created = image_env.run(image_env.leaseworker, *target, "table", "create")
    assert created.returncode == 0, created.stderr
    added = image_env.run(
        image_env.leaseworker, *target, "connections", "add", "feed-1", "--url", f"{feed}/feeds/feed-1"
    )
    assert added.returncode == 0, added.stderr

    sink_file = tmp_path / "sink" / "image-w1.jsonl"
    log = tmp_path / "worker.log"
    health_file = str(tmp_path / "health.json")
    env = image_env.env(
        TABLE_NAME=table,
        AWS_ENDPOINT_URL_DYNAMODB=dynamodb_endpoint,
        SINK=f"file:{sink_file.parent}",
        WORKER_ID="image-w1",
        LEASE_SECONDS="3",
        HEARTBEAT_SECONDS="1",
        RECONCILE_SECONDS="1",
        CHECKPOINT_SECONDS="1",
        MAX_CLOCK_SKEW_MS="200",
        SHUTDOWN_GRACE_SECONDS=str(SHUTDOWN_GRACE_SECONDS),
        LEASEWORKER_HEALTH_FILE=health_file,
        **extra_env,
    )
    started = time.monotonic()
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [str(image_env.leaseworker), "run"], env=env, cwd=image_env.root, stdout=out, stderr=out
        )
    try:
        deadline = started + 30
        while not delivered(sink_file) and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.1)
        first_record = time.monotonic() - started
        assert delivered(sink_file), f"no record within 30 s; worker log:\n{log.read_text()[-3000:]}"
        time.sleep(RUN_SECONDS)
        assert worker.poll() is None, log.read_text()[-3000:]
        health_while_running = image_env.run(
            image_env.leaseworker, "health", LEASEWORKER_HEALTH_FILE=health_file
        )
        stopping = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(SHUTDOWN_GRACE_SECONDS + 5)
        stopped = time.monotonic()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    return WorkerRun(
        code=code,
        records=delivered(sink_file),
        log=log.read_text(),
        first_record_seconds=first_record,
        ran_seconds=stopping - started,
        shutdown_seconds=stopped - stopping,
        health_while_running=health_while_running,
        health_after_exit=image_env.run(image_env.leaseworker, "health", LEASEWORKER_HEALTH_FILE=health_file),
    )


@pytest.mark.parametrize("tracing", ["off", "collector-hangs"])
def test_the_worker_runs_from_the_image_env_and_stops_on_sigterm(
    image_env: ImageEnv,
    dynamodb_endpoint: str,
    feed: str,
    tmp_path: Path,
    tracing: str,
    request: pytest.FixtureRequest,
) -> None:
    """One connection, the file sink, SIGTERM: exit 0 within the grace period, records delivered.

    With tracing on and a collector that never answers, shutdown must still fit the grace period
    (tracing's shutdown is bounded; ECS would SIGKILL a worker that overstays it)."""
    otel = {}
    if tracing == "collector-hangs":
        endpoint = request.getfixturevalue("blackhole")
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_TRACES_SAMPLER": "always_on"}
    run = run_worker(image_env, dynamodb_endpoint, feed, tmp_path, **otel)
    assert run.code == 0, run.log[-3000:]
    assert "Traceback" not in run.log
    seqs = [int(str(r["seq"])) for r in run.records]
    assert {r["connection_id"] for r in run.records} == {"feed-1"}
    assert {r["worker_id"] for r in run.records} == {"image-w1"}
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # one epoch, nothing lost in the file
    assert run.health_after_exit.returncode == 1  # whatever the file says, that pid is gone
    print(
        f"\nimage env worker (tracing {tracing}): first record after {run.first_record_seconds:.1f} s, "
        f"ran {run.ran_seconds:.1f} s, {len(run.records)} records delivered, "
        f"SIGTERM to exit 0 in {run.shutdown_seconds:.1f} s"
    )


def test_leaseworker_health_passes_for_the_running_worker_only(
    image_env: ImageEnv, dynamodb_endpoint: str, feed: str, tmp_path: Path
) -> None:
    """The container health check (docs/design.md §8) against the real worker: 0 while it runs, 1 after."""
    run = run_worker(image_env, dynamodb_endpoint, feed, tmp_path)
    assert run.code == 0, run.log[-3000:]
    assert run.health_after_exit.returncode == 1
    assert run.health_while_running.returncode == 0, run.health_while_running.stderr
    assert run.health_while_running.stdout.startswith("healthy: worker image-w1 (pid ")


def docker_engine() -> tuple[str | None, str]:
    """The docker CLI to use and, when there is none that works, why (one line)."""
    docker = os.environ.get("CDK_DOCKER") or "docker"
    path = shutil.which(docker)
    if path is None:
        return None, f"no Docker engine ({docker!r} is not on PATH; set CDK_DOCKER to use another CLI)"
    info = subprocess.run([path, "info"], capture_output=True, text=True, timeout=30, check=False)
    if info.returncode != 0:
        reason = (info.stderr.strip().splitlines() or ["docker info failed"])[-1]
        return None, f"no Docker engine ({path} info: {reason})"
    return path, ""


def test_the_docker_image_builds_and_starts() -> None:
    docker, why = docker_engine()
    if docker is None:
        pytest.skip(f"skipped: {why}")
    done = subprocess.run(
        ["make", "-s", "image"], cwd=REPO, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "leaseworker run" in done.stdout or "Commands:" in done.stdout, done.stdout
