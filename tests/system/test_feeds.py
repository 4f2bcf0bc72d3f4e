"""Real feeds through a real fleet under faults, judged from outside (docs/design.md §2c, §2e, §4.3, §5).

Two `generic/1` connections from the shipped presets, pointed (`url=`) at the local replays:
`jetstream` (can replay: resumes from its `time_us` cursor) and `coinbase-exchange` (cannot
replay; keyed by product; trade ids per product consecutive). Two `leaseworker run` workers
(supervisor + worker child, so the §2e path is real) with a file sink, at scaled timings (lease
3 s, heartbeat 1 s), in both lease modes. The first worker is started alone and holds both
connections; its reconcile period is long (30 s) so that it does not hand one back to the second
worker before the fault (the fair share of 2 connections over 2 workers is 1): every fault then
hits both feeds. The faults, each on the owner's worker child:
- SIGKILL (an OOM-like death): the supervisor's confirmed fence and hints, takeover at once;
- SIGSTOP past the lease, then SIGCONT: the lease takes over; the woken child is fenced and
  delivers nothing;
- SIGTERM (graceful handoff): released with the final checkpoint, taken within about a second.
After the other worker has delivered for a few seconds, everything stops and the sink (read by one
tailer, the arrival-order arbiter: feeds_fleet.py) and the replays' ledgers (what each socket was
SENT) are judged: S1, seq contiguity per epoch, loss (Jetstream: none, no marker; Coinbase: none
while a socket is up, every hole inside a gap marker), and the consumer filter's output (each
message once, in order). Each test then shows that its checks fail on a doctored copy of its own
sink output (negative controls).

All six cases (3 faults x 2 lease modes) run by default: about 70 s together on 2 cores.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from leaseworker.local.fleet import FAST
from leaseworker.worker.fenced import EXIT_FENCED
from tests.system.feeds_fleet import (
    Arrival,
    FeedsFleet,
    check_consumer,
    check_not_replayable,
    check_replayable,
    check_s1,
    check_seqs,
    drop_one,
    move_late,
    wait_until,
)
from tests.system.test_failover import CONNECT_ALLOWANCE_S, L1_BOUND_S, L2_BOUND_S
from tests.system.test_fast_takeover import FENCE_PATH_S

JS, CB = "js-1", "cb-1"
JS_RATE = 20.0  # events per second
CB_RATE = 5.0  # trades per second per product
PRODUCTS = ("BTC-USD", "ETH-USD")
DELIVER_AFTER_S = 4.0  # the survivor delivers this long after it took both over
SIGKILL_STATUS = 128 + signal.SIGKILL

CASES = [
    pytest.param("session", "kill", id="session-sigkill"),
    pytest.param("connection", "kill", id="connection-sigkill"),
    pytest.param("session", "stop", id="session-sigstop"),
    pytest.param("connection", "stop", id="connection-sigstop"),
    pytest.param("session", "term", id="session-sigterm"),
    pytest.param("connection", "term", id="connection-sigterm"),
]


@pytest.fixture
def fleet(
    tmp_path: Path, dynamodb_endpoint: str, moto_endpoint: str, marker: str, request: pytest.FixtureRequest
) -> Iterator[FeedsFleet]:
    mode = request.node.callspec.params["mode"]
    running = FeedsFleet(tmp_path, dynamodb_endpoint, moto_endpoint, marker, mode, FAST)
    try:
        running.start({"jetstream": {"rate": JS_RATE}, "coinbase-exchange": {"rate": CB_RATE}})
        yield running
    finally:
        running.close()


def data_count(fleet: FeedsFleet, cid: str, owner: str) -> int:
    return sum(
        1
        for a in fleet.tailer.arrivals()
        if a.cid == cid and a.record["worker_id"] == owner and a.record["kind"] == "data"
    )


def first_of_epoch(arrivals: list[Arrival], cid: str, above: int) -> int | None:
    found = [int(a.record["received_at_ms"]) for a in arrivals if a.cid == cid and a.epoch > above]
    return min(found) if found else None


@pytest.mark.parametrize(("mode", "fault"), CASES)
def test_real_feeds_across_a_fault(fleet: FeedsFleet, mode: str, fault: str) -> None:
    assert fleet.replays is not None
    js_server = fleet.replays.servers["jetstream"]
    cb_server = fleet.replays.servers["coinbase-exchange"]
    fleet.add_preset(JS, "jetstream", {"url": js_server.url})
    fleet.add_preset(CB, "coinbase-exchange", {"url": cb_server.url, "product_ids": ",".join(PRODUCTS)})

    # w1 alone takes both; its long reconcile keeps it from handing one back before the fault.
    w1 = fleet.start_worker("w1", {"RECONCILE_SECONDS": "30"})
    wait_until(lambda: {o for o, _ in fleet.leases().values()} == {"w1"}, 30, "w1 to own both")
    wait_until(
        lambda: data_count(fleet, JS, "w1") >= 20 and data_count(fleet, CB, "w1") >= 10,
        20,
        "w1 delivering both feeds",
    )
    w2 = fleet.start_worker("w2")
    wait_until(lambda: fleet.session("w2") is not None, 30, "w2's session")
    time.sleep(1.5)  # w2's loops (listing, hints) are running
    before = fleet.leases()
    assert {owner for owner, _ in before.values()} == {"w1"}, f"w1 handed one back before the fault: {before}"

    child = w1.child()
    fault_ms = time.time_ns() // 1_000_000
    if fault == "kill":
        os.kill(child, signal.SIGKILL)
        assert fleet.wait_exit("w1", 15) == SIGKILL_STATUS, w1.tail()
    elif fault == "term":
        os.kill(w1.popen.pid, signal.SIGTERM)  # to the supervisor, which forwards it
        assert fleet.wait_exit("w1", 15) == 0, w1.tail()
    else:
        os.kill(child, signal.SIGSTOP)
    wait_until(
        lambda: all(
            owner == "w2" and epoch > before[cid][1] for cid, (owner, epoch) in fleet.leases().items()
        ),
        20,
        "w2 to own both at a higher epoch",
    )
    wait_until(
        lambda: all(first_of_epoch(fleet.tailer.arrivals(), cid, before[cid][1]) for cid in (JS, CB)),
        15,
        "records of the new epochs",
    )
    if fault == "stop":
        wait_until(lambda: bool((fleet.session("w1") or {}).get("fenced_by")), 15, "w1's session fenced")
        session = fleet.session("w1") or {}
        assert not str(session.get("fenced_by", "")).startswith("supervisor:"), session
        assert w1.popen.poll() is None, "a paused child is not a dead one"
        os.kill(child, signal.SIGCONT)
        assert fleet.wait_exit("w1", 15) == EXIT_FENCED, w1.tail()
    arrivals_now = fleet.tailer.arrivals()
    taken = {
        cid: ((first_of_epoch(arrivals_now, cid, before[cid][1]) or 0) - fault_ms) / 1000 for cid in (JS, CB)
    }
    time.sleep(DELIVER_AFTER_S)
    os.kill(w2.popen.pid, signal.SIGTERM)
    assert fleet.wait_exit("w2", 15) == 0, w2.tail()
    arrivals = fleet.tailer.stop()
    fleet.replays.stop()  # the ledgers are complete
    js_ledger = fleet.replays.ledger("jetstream")
    cb_ledger = fleet.replays.ledger("coinbase-exchange")
    fleet.save_ledger("jetstream", js_ledger)  # beside the sink and logs, for a failure's evidence
    fleet.save_ledger("coinbase-exchange", cb_ledger)

    # The tailer saw every line of every sink file.
    on_disk = sum(len(p.read_text().splitlines()) for p in fleet.sink_dir.glob("*.jsonl"))
    assert on_disk == len(arrivals), (on_disk, len(arrivals))

    def judge(copy: list[Arrival]) -> list[str]:
        return [
            *check_s1(copy),
            *check_seqs(copy),
            *check_replayable(copy, JS, js_ledger),
            *check_not_replayable(copy, CB, cb_ledger, rate=CB_RATE, t0_wall_ms=cb_server.t0_wall_ms),
            *check_consumer(copy, JS),
            *check_consumer(copy, CB),
        ]

    violations = judge(arrivals)
    summary = summarise(arrivals, before, taken)
    print(f"\nfeeds {mode} {fault}: {summary}")
    assert not violations, (violations[:20], summary)

    # Each epoch of the feed that cannot replay starts with its socket's marker.
    for epoch in sorted({a.epoch for a in arrivals if a.cid == CB}):
        first = next(a.record for a in arrivals if a.cid == CB and a.epoch == epoch and a.seq == 0)
        expected = "connect" if epoch == before[CB][1] else "takeover"
        assert first["kind"] == "gap" and first["data"]["reason"] == expected, first
    # Two epochs each, both delivered.
    for cid in (JS, CB):
        assert {a.epoch for a in arrivals if a.cid == cid} == {before[cid][1], before[cid][1] + 1}
    if fault == "term":  # a graceful handoff replays nothing
        for cid in (JS, CB):
            held = [
                (a.record.get("key"), a.record["cursor"])
                for a in arrivals
                if a.cid == cid and a.record["kind"] == "data"
            ]
            assert len(held) == len(set(held)), f"{cid}: replayed across a graceful handoff"
        assert max(taken.values()) <= L2_BOUND_S, taken
    elif fault == "kill":
        assert max(taken.values()) <= FENCE_PATH_S + CONNECT_ALLOWANCE_S, taken
    else:
        assert max(taken.values()) <= L1_BOUND_S[mode], taken

    negative_controls(arrivals, judge, before)


def negative_controls(arrivals: list[Arrival], judge: Any, before: dict[str, tuple[str | None, int]]) -> None:
    """The checks fail on doctored copies of this run's own sink output."""
    old_js, old_cb = before[JS][1], before[CB][1]
    js_count: dict[Any, int] = {}
    for a in arrivals:
        if a.cid == JS:
            js_count[a.record["cursor"]] = js_count.get(a.record["cursor"], 0) + 1
    # 1. One Jetstream event, delivered once, removed: lost, a seq hole, and the consumer (who
    #    waits for the missing seq) yields nothing of that epoch after it.
    copy, dropped = drop_one(
        arrivals, lambda a: a.cid == JS and a.seq == 10 and js_count[a.record["cursor"]] == 1
    )
    found = judge(copy)
    assert any(f"never reached the sink, first [{dropped.record['cursor']}" in v for v in found), found
    assert f"seq {JS} epoch {dropped.epoch}: 1 seqs missing, first [10]" in found, found
    assert any(v.startswith(f"consumer {JS}") for v in found), found

    # 2. One Coinbase trade in the middle of a socket removed: missing while connected, unmarked.
    copy, dropped = drop_one(arrivals, lambda a: a.cid == CB and a.epoch == old_cb and a.seq == 12)
    assert dropped.record["kind"] == "data", dropped.record
    found = judge(copy)
    trade = dropped.record["cursor"]
    assert any("never arrived" in v and str(trade) in v for v in found), found
    assert any(f"trades {trade}..{trade} missing with no gap marker" in v for v in found), found

    # 3. The takeover marker removed where trades were lost at the takeover: an unmarked hole.
    trades = [
        (a.record["key"], a.record["cursor"], a.epoch)
        for a in arrivals
        if a.cid == CB and a.record["kind"] == "data"
    ]
    holed = [
        product
        for product in PRODUCTS
        if (
            max((t for k, t, e in trades if k == product and e == old_cb), default=0) + 1
            < min((t for k, t, e in trades if k == product and e > old_cb), default=0)
        )
    ]
    if holed:
        copy, dropped = drop_one(arrivals, lambda a: a.cid == CB and a.epoch > old_cb and a.seq == 0)
        assert dropped.record["data"]["reason"] == "takeover"
        found = judge(copy)
        assert any(f"{holed[0]} trades" in v and "missing with no gap marker" in v for v in found), found

    # 4. A record of the old epoch written again after the new epoch's: S1 (caught by the arbiter
    #    alone: its received_at_ms is as early as it was).
    copy = move_late(arrivals, lambda a: a.cid == JS and a.epoch == old_js)
    found = judge(copy)
    assert any(v.startswith(f"S1 {JS}: epoch {old_js}") for v in found), found


def summarise(
    arrivals: list[Arrival], before: dict[str, tuple[str | None, int]], taken: dict[str, float]
) -> dict[str, Any]:
    summary: dict[str, Any] = {"takeover_s": {cid: round(s, 2) for cid, s in taken.items()}}
    for cid in (JS, CB):
        mine = [a.record for a in arrivals if a.cid == cid]
        data = [(r.get("key"), r["cursor"]) for r in mine if r["kind"] == "data"]
        summary[cid] = {
            "records": len(mine),
            "data": len(data),
            "replayed": len(data) - len(set(data)),
            "markers": [(r["epoch"], r["data"]["reason"]) for r in mine if r["kind"] == "gap"],
        }
    cb = [
        (a.record["key"], a.record["cursor"]) for a in arrivals if a.cid == CB and a.record["kind"] == "data"
    ]
    missing = {}
    for product in PRODUCTS:
        ids = {t for k, t in cb if k == product}
        if ids:
            missing[product] = len(set(range(min(ids), max(ids) + 1)) - ids)
    summary["cb_missing_trades"] = missing
    return summary
