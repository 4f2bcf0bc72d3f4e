"""`python -m leaseworker_dev.chaos --seed N --duration S --mode session|connection [--json]`.

Kept out of the `leaseworker` CLI: it starts a whole local fleet and breaks it on purpose.
Exit status 0 when every check passed, 1 when one failed (the table names it), 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

from leaseworker_dev.chaos.runner import DEFAULT_FEED_RATE, RunConfig, run
from leaseworker_dev.chaos.schedule import ALL_KINDS, MODES, SOAK_KINDS, SOAK_QUIET_S, make_schedule
from leaseworker_dev.chaos.unsafe import SWITCHES

MAX_DURATION_S = 1800.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m leaseworker_dev.chaos", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="the schedule's seed (random and printed if absent)"
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of faults (<= 1800)")
    parser.add_argument("--mode", choices=MODES, default="session")
    parser.add_argument("--kinds", default=",".join(ALL_KINDS), help="comma list of nemesis kinds")
    parser.add_argument("--connections", type=int, default=24)
    parser.add_argument(
        "--rate", type=float, default=DEFAULT_FEED_RATE, help="messages per second per connection"
    )
    parser.add_argument(
        "--root", type=Path, default=None, help="where logs, schedule.json and verdict.json go"
    )
    parser.add_argument(
        "--unsafe", choices=sorted(SWITCHES), default=None, help="a negative control (test only)"
    )
    parser.add_argument(
        "--soak", action="store_true", help="steady load, a fault every ~minute, 2 workers never faulted"
    )
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON as well")
    args = parser.parse_args(argv)
    if not 10 <= args.duration <= MAX_DURATION_S:
        parser.error(f"--duration must be within 10..{MAX_DURATION_S:g} s")
    kinds = SOAK_KINDS if args.soak else tuple(k for k in args.kinds.split(",") if k)
    unknown = set(kinds) - set(ALL_KINDS)
    if unknown:
        parser.error(f"unknown kinds {sorted(unknown)}; known: {', '.join(ALL_KINDS)}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    quiet = SOAK_QUIET_S if args.soak else 0.0
    schedule = make_schedule(seed, args.duration, args.mode, kinds=kinds, quiet_s=quiet)
    root = args.root or Path(tempfile.mkdtemp(prefix=f"chaos-{args.mode}-{seed}-"))
    verdict = run(
        RunConfig(
            schedule,
            root,
            connections=args.connections,
            feed_rate=args.rate,
            unsafe=args.unsafe,
            protect=2 if args.soak else 0,
        )
    )
    print(verdict.table())
    print(f"chaos: artifacts in {root}")
    if args.json:
        print(json.dumps({k: v for k, v in verdict.as_dict().items() if k != "log"}))
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
