"""P2, traced: one graceful handoff from SIGTERM to the takers' first subscribes, step by step.

A local fleet at production timings (no time scale: a handoff's steps are round trips and
wake-ups, not periods), N connections on W workers, the feed sending at `rate` msg/s each. Once
every connection is owned and the balance has settled, the busiest worker gets SIGTERM; then,
for each connection it held, the milliseconds from the signal to each step, read from the
worker logs (LOG_LEVEL=DEBUG for the hint lines) and the feed's session log:

- `shutdown`: the victim's worker child logs "shutting down" (the supervisor forwarded SIGTERM);
- `closed`: the feed saw the victim's socket close (the 1001 handshake; the sink has the last
  batch before that);
- `released`: the victim's release landed, carrying the final checkpoint ("lease released");
- `hint_sent`: its SQS send_message returned;
- `hint_read`: a peer's long poll returned the hint (the victim's own last poll may read some
  of its hints too: it passes them on, a second send; `hint_read` is then the peer's read);
- `claim_sent`: a peer sends its conditional claim (a handoff hint's, or a reconcile's);
- `acquired`: the claim landed ("lease acquired");
- `subscribed`: the feed saw the taker's subscribe at the new epoch (P2's end point).

    .venv/bin/python -m bench.handoff_trace [--connections 80] [--workers 4] [--rounds 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.designs import CONNECTION, SESSION
from bench.failover import busiest, percentile
from leaseworker_dev.local.fleet import Fleet, poll_until
from leaseworker_dev.local.invariants import check_all, read_events

STEPS = ("shutdown", "closed", "released", "hint_sent", "hint_read", "claim_sent", "acquired", "subscribed")
_MESSAGES = {
    "lease released": "released",
    "hint sent": "hint_sent",  # before hints were sent in batches
    "hints sent": "hint_sent",
    "hint received": "hint_read",
    "claim sent": "claim_sent",
    "lease acquired": "acquired",
}


def _log_ms(line: dict[str, Any]) -> int:
    stamp = datetime.datetime.strptime(str(line["timestamp"]), "%Y-%m-%d %H:%M:%S,%f%z")
    return int(stamp.timestamp() * 1000)


def _worker_lines(logs: Path) -> list[tuple[str, dict[str, Any]]]:
    lines: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(logs.glob("*.log")):
        for text in path.read_text(errors="replace").splitlines():
            if text.startswith('{"level"'):
                with contextlib.suppress(ValueError):
                    lines.append((path.stem, json.loads(text)))
    return lines


def trace(
    fleet: Fleet, victim: str, ids: set[str], sent_ms: int, epochs: dict[str, int]
) -> dict[str, dict[str, Any]]:
    """Milliseconds from `sent_ms` to each step, per connection that `victim` held."""
    steps: dict[str, dict[str, Any]] = {cid: {} for cid in ids}
    shutdown: float | None = None
    for worker, line in _worker_lines(fleet.logs):
        t = _log_ms(line) - sent_ms
        if t < 0:
            continue
        message = line.get("message")
        if worker == victim and message == "shutting down":
            shutdown = t
        step = _MESSAGES.get(str(message))
        if step is None:
            continue
        mine = worker == victim
        if (step in ("released", "hint_sent")) != mine:
            continue  # the victim releases and sends; the others read, claim and acquire
        for cid in line.get("connection_ids") or [line.get("connection_id")]:
            if cid not in steps:
                continue
            if step == "acquired" and int(line.get("epoch", 0)) <= epochs[cid]:
                continue
            steps[cid].setdefault(step, t)
            if step in ("hint_read", "claim_sent", "acquired"):
                steps[cid].setdefault("taker", worker)
    for event in read_events(fleet.feed_log):
        cid = event.get("connection_id")
        t = int(event.get("t_ms", 0)) - sent_ms
        if cid not in steps or t < 0:
            continue
        if event.get("event") == "close" and int(event.get("epoch") or 0) == epochs[str(cid)]:
            steps[str(cid)].setdefault("closed", t)
        if event.get("event") == "subscribe" and int(event.get("epoch") or 0) > epochs[str(cid)]:
            steps[str(cid)].setdefault("subscribed", t)
    for connection_steps in steps.values():
        if shutdown is not None:
            connection_steps["shutdown"] = shutdown
    return steps


def _all_resubscribed(
    fleet: Fleet, ids: set[str], sent_ms: int, before: dict[str, tuple[str | None, int]]
) -> Callable[[], bool]:
    return lambda: len(fleet.resubscribed(ids, sent_ms, before)) == len(ids)


def summarise(steps: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for step in STEPS:
        values = [float(s[step]) for s in steps.values() if step in s]
        if values:
            out[step] = {
                "n": len(values),
                "min": min(values),
                "p50": percentile(values, 50),
                "p99": percentile(values, 99),
                "max": max(values),
                "mean": statistics.fmean(values),
            }
    return out


def print_trace(steps: dict[str, dict[str, Any]]) -> None:
    print("connection  " + " ".join(f"{s:>10}" for s in STEPS) + "  taker")
    for cid, step in sorted(steps.items(), key=lambda item: item[1].get("subscribed", 1e9)):
        cells = " ".join(f"{step[s]:>10.0f}" if s in step else f"{'-':>10}" for s in STEPS)
        print(f"{cid:<11} {cells}  {step.get('taker', '-')}")
    print("summary (ms after SIGTERM)")
    for name, row in summarise(steps).items():
        print(
            f"  {name:<10} n {row['n']:>3.0f}  min {row['min']:>5.0f}  p50 {row['p50']:>5.0f}"
            f"  p99 {row['p99']:>5.0f}  max {row['max']:>5.0f}"
        )


def run(
    *, connections: int, workers: int, rounds: int, rate: float, mode: str, keep: Path | None
) -> dict[str, Any]:
    design = SESSION if mode == "session" else CONNECTION
    timings = design.timings(1.0)
    results: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        root = keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-handoff-")))
        fleet = Fleet(root, timings=timings, feed_rate=rate, with_sqs=True, lease_mode=mode)
        with fleet:
            fleet.add_connections([f"h-{i:04d}" for i in range(connections)])
            live = {f"w{n}" for n in range(workers)}
            env = {"LOG_LEVEL": "DEBUG"}
            for name in sorted(live):
                fleet.start_worker(name, extra_env=env)
            poll_until(lambda: all(owner in live for owner, _ in fleet.leases().values()), 120)
            serial = workers
            for _ in range(rounds):
                time.sleep(2 * timings.heartbeat_seconds)  # the balance settles
                victim = busiest(fleet, live)
                before = fleet.leases()
                ids = {cid for cid, (owner, _) in before.items() if owner == victim}
                epochs = {cid: before[cid][1] for cid in ids}
                sent_ms = int(fleet.signal(victim, signal.SIGTERM) * 1000)
                poll_until(_all_resubscribed(fleet, ids, sent_ms, before), 30, 0.25)
                fleet.wait_exit(victim, timings.shutdown_grace_seconds + 5)
                steps = trace(fleet, victim, ids, sent_ms, epochs)
                print(f"round: SIGTERM to {victim} holding {len(ids)}")
                print_trace(steps)
                results.append({"victim": victim, "steps": steps, "summary": summarise(steps)})
                live.discard(victim)
                replacement = f"w{serial}"
                serial += 1
                fleet.start_worker(replacement, extra_env=env)
                live.add(replacement)
            time.sleep(2 * timings.heartbeat_seconds)
        report, _ = check_all(root / "sink")
    subscribed = [float(s["subscribed"]) for r in results for s in r["steps"].values() if "subscribed" in s]
    held = sum(len(r["steps"]) for r in results)
    print(
        f"P2 over {len(subscribed)}/{held} handoffs: p50 {percentile(subscribed, 50):.0f} ms, "
        f"p99 {percentile(subscribed, 99):.0f} ms, max {max(subscribed, default=float('nan')):.0f} ms; "
        f"invariants {'ok' if report.ok else report.violations[:3]}"
    )
    return {"rounds": results, "invariants_ok": report.ok, "p2_ms": sorted(subscribed)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--connections", type=int, default=80)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", type=float, default=5.0)
    parser.add_argument("--mode", choices=("session", "connection"), default="session")
    parser.add_argument("--keep", type=Path)
    parser.add_argument("--json", type=Path, help="write the trace here")
    args = parser.parse_args()
    result = run(
        connections=args.connections,
        workers=args.workers,
        rounds=args.rounds,
        rate=args.rate,
        mode=args.mode,
        keep=args.keep,
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
