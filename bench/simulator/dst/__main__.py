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
import io
import os
import sys
import time

from bench.simulator.dst.run import run
from bench.simulator.dst.schedule import schedule
from bench.simulator.dst.world import Timings
from leaseworker.observability.logging import configure_logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.simulator.dst", description=__doc__.split("\n")[0])
    parser.add_argument("--schedules", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1, help="the first schedule's seed")
    parser.add_argument("--mode", choices=("session", "connection", "both"), default="both")
    parser.add_argument("--unsafe", default="", help="a negative control, e.g. self-fencing")
    parser.add_argument("--verbose", action="store_true", help="every schedule, not only failures")
    args = parser.parse_args(argv)
    if os.environ.get("PYTHONHASHSEED") != "0":  # set iteration order is part of a replay
        os.execve(
            sys.executable,
            [sys.executable, "-m", "bench.simulator.dst", *(argv or sys.argv[1:])],
            {**os.environ, "PYTHONHASHSEED": "0"},
        )
    configure_logging("CRITICAL", stream=io.StringIO())
    if args.unsafe:
        from leaseworker_dev.chaos import unsafe

        unsafe.apply_from_environment(
            {unsafe.DISABLE_VAR: args.unsafe, unsafe.CONFIRM_VAR: unsafe.CONFIRM_VALUE}
        )
    modes = ("session", "connection") if args.mode == "both" else (args.mode,)
    timings = Timings()
    started = time.perf_counter()
    failed = 0
    worker_seconds = 0.0
    for seed in range(args.seed, args.seed + args.schedules):
        for mode in modes:
            plan = schedule(seed, mode, lease_seconds=timings.lease_seconds)
            verdict = run(plan, timings)
            worker_seconds += verdict.virtual_seconds * plan.workers
            if not verdict.ok:
                failed += 1
                print(f"FAILED {plan.describe()}: digest {verdict.digest}")
                for line in verdict.violations[:5]:
                    print(f"  {line}")
                print(f"  replay: make sim SEED={seed} MODE={mode}")
            elif args.verbose:
                print(f"ok {plan.describe()}: {verdict.delivered} records, digest {verdict.digest}")
            sys.stdout.flush()
    wall = time.perf_counter() - started
    runs = args.schedules * len(modes)
    print(
        f"{runs} schedules, {failed} failed, in {wall:.1f} s wall: {runs / wall * 60:.0f} schedules/min,"
        f" {worker_seconds / 3600 / (wall / 60):.1f} simulated worker-hours per wall minute"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
