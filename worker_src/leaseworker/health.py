"""The worker's health file, and the judgement `leaseworker health` makes from it (docs/design.md §8).

The worker calls `HealthFile.beat()` after every successful heartbeat and `HealthFile.stopping()`
when shutdown begins. The container's health check runs `leaseworker health`, a separate process in
the same container, which reads the file and calls `judge()`.

Why the monotonic clock: CLOCK_MONOTONIC is one clock for every process of the machine (a
container shares the host's), it never jumps when NTP steps the wall clock, and the health check
reads the same clock as the worker. A file left behind by an earlier boot, or by a process
whose monotonic reading is far ahead of ours, is not trusted. The pid is recorded as well: a
recent beat from a process that no longer exists is not a healthy worker.

Writes are atomic (a temporary file in the same directory, then `os.replace`), so the health
check never reads half a file. A write that fails never reaches the worker: the failure is
logged (once, until a write succeeds again) and the heartbeat loop carries on; the health check
then reports the file as stale, which is the truth.

Which file: one per fleet and user. On a shared host several workers write health files, from
other checkouts or other fleets; a single fixed path made `leaseworker health` report another
fleet's worker. So the default path is `/tmp/leaseworker/health-<scope>.json`, `<scope>` a digest
of the fleet the process belongs to (TABLE_NAME, the DynamoDB endpoint, the region: what
`leaseworker run` and `leaseworker health` both read from the environment, and in a container
both have the same) and of the user id. The record also names its fleet, and the check refuses a
record of another fleet or a file another user owns. LEASEWORKER_HEALTH_FILE (or `--file`)
names a file explicitly: it is judged as it is, and the answer names the worker's fleet.

Only the failure path imports the logging stack, so the health check itself starts fast.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from leaseworker.clock import monotonic, wall_time
from leaseworker.settings import DEFAULT_TABLE

if TYPE_CHECKING:
    from aws_lambda_powertools import Logger

__all__ = [
    "DEFAULT_HEALTH_DIR",
    "HEALTH_FILE_ENV",
    "HealthFile",
    "fleet_of",
    "health_file_path",
    "judge",
    "pid_alive",
    "stale_after_seconds",
]

HEALTH_FILE_ENV: Final = "LEASEWORKER_HEALTH_FILE"
DEFAULT_HEALTH_DIR: Final = "/tmp/leaseworker"  # the image prepares it (worker_src/Dockerfile)
STATE_RUNNING: Final = "running"
STATE_STOPPING: Final = "stopping"
HEARTBEATS_BEFORE_STALE: Final = 3
# A beat stamped this far in the checker's future was not written on this machine's current boot.
FUTURE_TOLERANCE_SECONDS: Final = 1.0


def fleet_of(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The fleet a worker (or the health check) belongs to, as the worker's settings read it:
    its table, its DynamoDB endpoint ("" for AWS's own) and its region."""
    env = os.environ if environ is None else environ
    return {
        "table": env.get("TABLE_NAME") or DEFAULT_TABLE,
        "endpoint": env.get("AWS_ENDPOINT_URL_DYNAMODB") or env.get("AWS_ENDPOINT_URL") or "",
        "region": env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "",
    }


def describe_fleet(fleet: Mapping[str, Any]) -> str:
    """`table T at http://127.0.0.1:8000 in us-east-1` (`at AWS` without an endpoint)."""
    place = f"at {fleet.get('endpoint')}" if fleet.get("endpoint") else "at AWS"
    region = f" in {fleet.get('region')}" if fleet.get("region") else ""
    return f"table {fleet.get('table', '?')} {place}{region}"


def default_health_file(environ: Mapping[str, str] | None = None, uid: int | None = None) -> Path:
    """/tmp/leaseworker/health-<digest of the fleet and the user>.json"""
    scope = {**fleet_of(environ), "uid": os.getuid() if uid is None else uid}
    digest = hashlib.sha256(json.dumps(scope, sort_keys=True).encode()).hexdigest()[:16]
    return Path(DEFAULT_HEALTH_DIR) / f"health-{digest}.json"


def health_file_path(environ: Mapping[str, str] | None = None) -> Path:
    """The health file's path: LEASEWORKER_HEALTH_FILE, else this fleet's and user's default."""
    env = os.environ if environ is None else environ
    explicit = env.get(HEALTH_FILE_ENV)
    return Path(explicit) if explicit else default_health_file(env)


def stale_after_seconds(heartbeat_seconds: float, lease_seconds: float) -> float:
    """How old the last beat may be: the longer of three heartbeats and one lease.

    One missed heartbeat is ordinary (a slow renewal under its deadline); three in a row, or a
    whole lease without one, means the worker can no longer hold what it owns.
    """
    return max(HEARTBEATS_BEFORE_STALE * heartbeat_seconds, lease_seconds)


class HealthFile:
    """Writes the health file. Neither method ever raises (an OSError is logged and dropped)."""

    def __init__(
        self,
        path: Path | str,
        *,
        fleet: dict[str, str] | None = None,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        self.path = Path(path)
        self.fleet = fleet_of() if fleet is None else fleet
        self._clock = clock
        self._failing = False
        self._stopping = False
        self._last: dict[str, Any] | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HealthFile:
        return cls(health_file_path(environ), fleet=fleet_of(environ))

    def beat(self, *, worker_id: str, heartbeat_seconds: float, lease_seconds: float) -> None:
        """Record a successful heartbeat now. After `stopping()` it does nothing (renewals go on
        during shutdown, but the worker must not look healthy again)."""
        if self._stopping:
            return
        self._write(
            {
                "state": STATE_RUNNING,
                "worker_id": worker_id,
                "pid": os.getpid(),
                "monotonic": self._clock(),
                "wall_ms": int(wall_time() * 1000),  # for people reading the file; never judged
                "heartbeat_seconds": heartbeat_seconds,
                "lease_seconds": lease_seconds,
                "fleet": self.fleet,
            }
        )

    def stopping(self) -> None:
        """Record that shutdown has begun: from now on the worker reports unhealthy."""
        self._stopping = True
        content = dict(self._last or {"pid": os.getpid()})
        content.update(state=STATE_STOPPING, monotonic=self._clock(), wall_ms=int(wall_time() * 1000))
        self._write(content)

    def _write(self, content: dict[str, Any]) -> None:
        self._last = content
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            _make_directory(self.path.parent)
            tmp.write_text(json.dumps(content, separators=(",", ":")) + "\n", encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as error:
            if not self._failing:
                _log().warning("cannot write the health file", path=str(self.path), error=str(error))
            self._failing = True
            return
        if self._failing:
            _log().info("the health file is written again", path=str(self.path))
        self._failing = False


def _make_directory(directory: Path) -> None:
    """The default directory is shared like /tmp (mode 1777: each user's files are their own);
    any other is made as asked."""
    if directory.is_dir():
        return
    directory.mkdir(parents=True, exist_ok=True)
    if directory == Path(DEFAULT_HEALTH_DIR):
        directory.chmod(0o1777)


def _log() -> Logger:
    # Imported late: the health check itself must not pay for the logging stack.
    from leaseworker.observability.logging import get_logger

    return get_logger(__name__)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (in this pid namespace)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by another user
    return True


def judge(
    content: str,
    now_monotonic: float,
    *,
    is_alive: Callable[[int], bool] = pid_alive,
    fleet: Mapping[str, str] | None = None,
) -> tuple[bool, str]:
    """Whether the health file's `content` shows a live, recently heartbeating worker, and why.
    With `fleet`, only a worker of that fleet can be healthy.

    Pure apart from `is_alive` (injected by tests). The reason is one line for a person.
    """
    try:
        data = json.loads(content)
        state = data["state"]
        pid = int(data["pid"])
        beat_at = float(data["monotonic"])
        limit = stale_after_seconds(float(data["heartbeat_seconds"]), float(data["lease_seconds"]))
    except (ValueError, TypeError, KeyError) as error:
        return False, f"the health file is not a worker's health record ({type(error).__name__}: {error})"
    written_by = data.get("fleet") if isinstance(data.get("fleet"), dict) else {}
    worker = f"worker {data.get('worker_id', '?')} (pid {pid})"
    if fleet is not None and {key: written_by.get(key) for key in fleet} != dict(fleet):
        theirs = describe_fleet(written_by) if written_by else "an unnamed fleet"
        return False, f"the health file is {worker}'s, of {theirs}, not of {describe_fleet(fleet)}"
    if written_by:
        worker += f" of {describe_fleet(written_by)}"
    age = now_monotonic - beat_at
    if state == STATE_STOPPING:
        return False, f"{worker} is shutting down"
    if state != STATE_RUNNING:
        return False, f"{worker} is in an unknown state {state!r}"
    if age < -FUTURE_TOLERANCE_SECONDS:
        return (
            False,
            f"{worker}'s heartbeat is from another boot (its clock is {-age:.1f} s ahead)",
        )
    if age > limit:
        return False, f"{worker}'s last successful heartbeat was {age:.1f} s ago (limit {limit:g} s)"
    if not is_alive(pid):
        return False, f"{worker} is not running"
    return True, f"{worker} heartbeat {max(age, 0.0):.1f} s ago"
