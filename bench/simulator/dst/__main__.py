"""`make sim`: seeded fault schedules against the real worker code, in virtual time.

    python -m bench.simulator.dst --schedules 200 [--seed 1] [--mode both] [--unsafe SWITCH]

Each schedule runs the real Workers of one fleet on a virtual-time loop (world.py) and is judged
from outside (checks.py: S1, S2, S3, never stranded, no crash). A failure prints its seed;
`--seed N --schedules 1 --mode M` (make sim SEED=N MODE=M) replays it exactly. `--unsafe`
turns on one of the fault suite's negative controls (dev_src/leaseworker_dev/chaos/unsafe.py)
for the whole run, which must then fail. Exit status 1 when any schedule failed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

from bench.simulator.dst.run import run
from bench.simulator.dst.schedule import schedule
from bench.simulator.dst.world import Timings
from leaseworker.observability.logging import configure_logging


def setup(unsafe_switches: str) -> None:
    """Each process: the workers' logs go nowhere, and the negative control asked for is on."""
    configure_logging("CRITICAL", stream=io.StringIO())
    if unsafe_switches:
        from leaseworker_dev.chaos import unsafe

        unsafe.apply_from_environment(
            {unsafe.DISABLE_VAR: unsafe_switches, unsafe.CONFIRM_VAR: unsafe.CONFIRM_VALUE}
        )


def judge(job: tuple[int, str, bool]) -> tuple[bool, float, list[str]]:
    """One schedule: (failed, simulated worker-seconds, the lines to print)."""
    seed, mode, verbose = job
    timings = Timings()
    plan = schedule(
        seed, mode, lease_seconds=timings.lease_seconds, max_clock_skew_ms=timings.max_clock_skew_ms
    )
    verdict = run(plan, timings)
    lines = []
    if not verdict.ok:
        lines.append(f"FAILED {plan.describe()}: digest {verdict.digest}")
        lines += [f"  {line}" for line in verdict.violations[:5]]
        lines.append(f"  replay: make sim SEED={seed} MODE={mode}")
    elif verbose:
        lines.append(f"ok {plan.describe()}: {verdict.delivered} records, digest {verdict.digest}")
    return not verdict.ok, verdict.virtual_seconds * plan.workers, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.simulator.dst", description=__doc__.split("\n")[0])
    parser.add_argument("--schedules", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1, help="the first schedule's seed")
    parser.add_argument("--mode", choices=("session", "connection", "mixed", "both"), default="both")
    parser.add_argument("--unsafe", default="", help="a negative control, e.g. self-fencing")
    parser.add_argument("--verbose", action="store_true", help="every schedule, not only failures")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: the cores)"
    )
    args = parser.parse_args(argv)
    if os.environ.get("PYTHONHASHSEED") != "0":  # set iteration order is part of a replay
        os.execve(
            sys.executable,
            [sys.executable, "-m", "bench.simulator.dst", *(argv or sys.argv[1:])],
            {**os.environ, "PYTHONHASHSEED": "0"},
        )
    modes = ("session", "connection", "mixed") if args.mode == "both" else (args.mode,)
    jobs = [
        (seed, mode, args.verbose) for seed in range(args.seed, args.seed + args.schedules) for mode in modes
    ]
    started = time.perf_counter()
    failed = 0
    worker_seconds = 0.0
    processes = max(1, min(args.jobs, len(jobs)))
    with contextlib.ExitStack() as stack:
        if processes == 1:
            setup(args.unsafe)
            results: Iterator[tuple[bool, float, list[str]]] = map(judge, jobs)
        else:
            pool = stack.enter_context(
                ProcessPoolExecutor(
                    processes,
                    mp_context=multiprocessing.get_context("fork"),
                    initializer=setup,
                    initargs=(args.unsafe,),
                )
            )
            results = pool.map(judge, jobs, chunksize=4)
        for bad, seconds, lines in results:  # in the schedules' order, whichever process ran them
            failed += bad
            worker_seconds += seconds
            for line in lines:
                print(line)
            sys.stdout.flush()
    wall = time.perf_counter() - started
    print(
        f"{len(jobs)} schedules, {failed} failed, in {wall:.1f} s wall on {processes} processes:"
        f" {len(jobs) / wall * 60:.0f} schedules/min,"
        f" {worker_seconds / 3600 / (wall / 60):.1f} simulated worker-hours per wall minute"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
