"""One worker with its wall clock offset, through libfaketime (docs/design.md §10, faults).

libfaketime is preloaded into the worker process only. `DONT_FAKE_MONOTONIC=1` keeps the
monotonic clock real, which the worker's deadlines and asyncio's timers run on; without it waits
hang. libfaketime breaks `time.sleep` in synchronous code, so this is for the asyncio worker only.

`offset_env` builds the environment; `probe` runs a tiny interpreter under it and measures what
the offset really is, so a test can skip (one line) when the library is missing or ineffective.
"""

from __future__ import annotations

import glob
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

LIBRARY_NAME = "libfaketime.so.1"
SEARCH_GLOBS = (
    "/usr/lib/*/faketime/" + LIBRARY_NAME,
    "/usr/lib/faketime/" + LIBRARY_NAME,
    "/usr/local/lib/faketime/" + LIBRARY_NAME,
)
PROBE_TIMEOUT_S = 15.0
# How far the measured offsets may be from what was asked: process start-up happens between
# the parent's two clock readings, so the child's reading lies inside that interval.
PROBE_TOLERANCE_S = 0.5

_PROBE_CODE = "import json, time; print(json.dumps([time.time(), time.monotonic()]))"


def find_libfaketime() -> Path | None:
    """The installed libfaketime.so.1 (Debian package `libfaketime`), or None."""
    for pattern in SEARCH_GLOBS:
        for candidate in sorted(glob.glob(pattern)):
            if Path(candidate).is_file():
                return Path(candidate)
    return None


def offset_env(library: Path, offset_seconds: float) -> dict[str, str]:
    """Variables that make a process's wall clock run `offset_seconds` ahead (or behind)."""
    return {
        "LD_PRELOAD": str(library),
        "FAKETIME": f"{offset_seconds:+g}",
        "DONT_FAKE_MONOTONIC": "1",  # libfaketime 0.9.x
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",  # newer spelling
        "FAKETIME_DONT_RESET": "1",
    }


@dataclass(frozen=True, slots=True)
class ProbeResult:
    wall_offset_s: float  # the child's time.time() minus ours
    monotonic_offset_s: float  # the child's time.monotonic() minus ours (0 when not faked)


class FaketimeUnavailable(RuntimeError):
    """libfaketime is missing or does not offset the clock as asked; str() says why."""


def probe(env: dict[str, str], offset_seconds: float) -> ProbeResult:
    """Measure the clocks of a process started with `env`; raise FaketimeUnavailable unless the
    wall clock is offset by `offset_seconds` and the monotonic clock is real."""
    wall_before, mono_before = time.time(), time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE_CODE],
            env=env,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise FaketimeUnavailable(f"the probe under libfaketime did not run: {error}") from None
    wall_after, mono_after = time.time(), time.monotonic()
    if done.returncode != 0:
        raise FaketimeUnavailable(f"the probe under libfaketime failed: {done.stderr.strip()[-200:]}")
    try:
        child_wall, child_mono = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise FaketimeUnavailable(f"the probe printed {done.stdout!r}") from None
    result = ProbeResult(
        wall_offset_s=_offset(float(child_wall), wall_before, wall_after),
        monotonic_offset_s=_offset(float(child_mono), mono_before, mono_after),
    )
    span = (wall_after - wall_before) + PROBE_TOLERANCE_S
    if abs(result.wall_offset_s - offset_seconds) > span:
        raise FaketimeUnavailable(
            f"libfaketime did not offset the wall clock: {result.wall_offset_s:+.2f} s, "
            f"asked {offset_seconds:+g} s"
        )
    if abs(result.monotonic_offset_s) > span:
        raise FaketimeUnavailable(
            f"libfaketime faked the monotonic clock too ({result.monotonic_offset_s:+.2f} s)"
        )
    return result


def _offset(child: float, before: float, after: float) -> float:
    """How far the child's reading lies outside our [before, after] interval (0 when inside)."""
    if child < before:
        return child - before
    if child > after:
        return child - after
    return 0.0
