"""The worker reads time through one seam, `leaseworker.clock` (issue 22 §1).

Outside the supervisor and the CLI (processes of their own, never simulated), no module of the
package reads `time` directly. The clock is a context variable: a task reads the clock of the
context it was created in, so a simulation can run workers on virtual clocks, one each, without
patching `time`.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
from pathlib import Path

from leaseworker import clock
from leaseworker.lease.dynamodb import now_ms
from leaseworker.no_linger import AbortOnCloseHandler, send_deadline

PACKAGE = Path(__file__).resolve().parents[3] / "worker_src" / "leaseworker"
OWN_PROCESSES = ("supervisor/", "cli/")
READS = {"monotonic", "time", "time_ns", "perf_counter", "monotonic_ns", "perf_counter_ns"}


class Offset:
    """The system's clock moved by `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def monotonic(self) -> float:
        return clock.SYSTEM.monotonic() + self.seconds

    def time(self) -> float:
        return clock.SYSTEM.time() + self.seconds

    def time_ns(self) -> int:
        return clock.SYSTEM.time_ns() + int(self.seconds * 1e9)


def direct_reads(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        attribute = (
            isinstance(node, ast.Attribute)
            and node.attr in READS
            and isinstance(node.value, ast.Name)
            and node.value.id == "time"
        )
        imported = (
            isinstance(node, ast.ImportFrom)
            and node.module == "time"
            and any(alias.name in READS for alias in node.names)
        )
        if attribute or imported:
            lines.append(getattr(node, "lineno", 0))
    return sorted(lines)


def test_only_the_clock_module_reads_time() -> None:
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative == "clock.py" or relative.startswith(OWN_PROCESSES):
            continue
        lines = direct_reads(ast.parse(path.read_text(), relative))
        if lines:
            offenders[relative] = lines
    assert offenders == {}


def test_the_check_finds_a_direct_read() -> None:
    source = "import time\nx = time.monotonic()\nfrom time import time_ns\ny = time.sleep\n"
    assert direct_reads(ast.parse(source)) == [2, 3]


async def test_tasks_read_the_clock_of_the_context_they_were_created_in() -> None:
    ahead = Offset(3600)

    async def read() -> tuple[float, int]:
        await asyncio.sleep(0)
        return clock.monotonic(), now_ms()

    outside = asyncio.create_task(read())
    with clock.using(ahead):
        inside = asyncio.create_task(read())
    (mono_out, wall_out), (mono_in, wall_in) = await outside, await inside
    assert 3599 < mono_in - mono_out < 3601
    assert 3_599_000 < wall_in - wall_out < 3_601_000
    assert clock.current() is clock.SYSTEM


class Transport(asyncio.WriteTransport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def abort(self) -> None:
        self.aborted = True


async def test_the_send_deadline_is_judged_on_the_workers_clock() -> None:
    """A write guarded by a deadline an hour away on the system clock is refused on a clock that
    runs an hour and a minute ahead: the lease code and the guard read the same clock."""
    transport = Transport()
    AbortOnCloseHandler(asyncio.get_running_loop()).connection_made(transport)
    with send_deadline(clock.monotonic() + 3600):
        transport.write(b"in time")
        with clock.using(Offset(3660)), contextlib.suppress(ConnectionResetError):
            transport.write(b"late")
    assert transport.written == [b"in time"]
    assert transport.aborted
