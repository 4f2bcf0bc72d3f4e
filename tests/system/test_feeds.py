"""Real feeds through a real fleet under faults, judged from outside (docs/design.md §2c, §2e, §4.3, §5).

Six `generic/1` connections, one per shipped preset, each pointed (`url=`) at its local replay:
`jetstream` (can replay: resumes from its `time_us` cursor) and five that cannot:
`coinbase-exchange` (keyed by product, trade ids consecutive), `binance-spot` (combined streams
keyed by stream: trades, and depth updates numbered `U`..`u`), `kraken-v2` (keyed by symbol,
trade ids consecutive, a 50-trade snapshot on subscribe), `alpaca` (array frames, auth frame,
ONE connection per key, trade ids not consecutive) and `home-assistant` (auth handshake, events
with no sequence number). The Alpaca key and secret and the Home Assistant token are
`{{env:NAME}}` references, resolved from the workers' environment.

Two `leaseworker run` workers (supervisor + worker child, so the §2e path is real) with a file
sink, at scaled timings (lease 3 s, heartbeat 1 s), in both lease modes. The first worker is
started alone and holds all six connections; its reconcile period is long (30 s) so that it does
not hand any back to the second worker before the fault: every fault then hits every feed. The
faults, each on the owner's worker child:
- SIGKILL (an OOM-like death): the supervisor's confirmed fence and hints, takeover at once;
- SIGSTOP past the lease, then SIGCONT: the lease takes over; the woken child is fenced and
  delivers nothing. Alpaca's paused socket still holds the key's one connection, so the new
  owner is refused (406) and backs off, without failing, until the old owner wakes and exits;
- SIGTERM (graceful handoff): released with the final checkpoint, taken within about a second.
After the other worker has delivered for a few seconds, everything stops and the sink (read by one
tailer, the arrival-order arbiter: feeds_fleet.py) and the replays' ledgers (what each socket was
SENT) are judged (feeds_checks.py): S1, seq contiguity per epoch, loss (Jetstream: none, no
marker; the others: none while a socket is up, every hole inside a gap marker), and the consumer
filter's output (each message once, in order). Each test then shows that its checks fail on
doctored copies of its own sink output (negative controls), for every feed.

All six cases (3 faults x 2 lease modes) run by default.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from leaseworker.worker.fenced import EXIT_FENCED
from leaseworker_dev.feed.replays import Entry
from leaseworker_dev.local.fleet import FAST
from tests.system.feeds_checks import (
    TAPE_SLACK_MS,
    Arrival,
    Upstream,
    change_one,
    check_consumer,
    check_not_replayable,
    check_replayable,
    check_s1,
    check_seqs,
    drop_one,
    missing_items,
    move_late,
    tapes_of,
)
from tests.system.feeds_fleet import FeedsFleet, wait_until
from tests.system.test_failover import CONNECT_ALLOWANCE_S, L1_BOUND_S, L2_BOUND_S
from tests.system.test_fast_takeover import FENCE_PATH_S

DELIVER_AFTER_S = 4.0  # the survivor delivers this long after it took all over
SIGKILL_STATUS = 128 + signal.SIGKILL
BACKOFF_CAP_S = 30.0  # worker/backoff.py: the longest reconnect delay
# Per run, distinctive: they must reach the replays, and never the sink or the logs.
ALPACA_KEY, ALPACA_SECRET, HA_TOKEN = (f"feeds-{what}-{uuid.uuid4().hex}" for what in ("ak", "as", "ha"))
SECRETS_ENV = {
    "FEEDS_ALPACA_KEY": ALPACA_KEY,
    "FEEDS_ALPACA_SECRET": ALPACA_SECRET,
    "FEEDS_HA_TOKEN": HA_TOKEN,
}


@dataclass(frozen=True, slots=True)
class Feed:
    cid: str
    preset: str
    replay: dict[str, Any]  # the replay server's options (rate: items per second per key)
    params: Callable[[str], dict[str, str]]  # the preset's params, from the replay's URL
    warm: int  # data records the first owner delivers before the fault


JS = Feed("js-1", "jetstream", {"rate": 20.0}, lambda url: {"url": url}, 20)
CB = Feed(
    "cb-1",
    "coinbase-exchange",
    {"rate": 5.0},
    lambda url: {"url": url, "product_ids": "BTC-USD,ETH-USD"},
    10,
)
BN = Feed(
    "bn-1",
    "binance-spot",
    {"rate": 5.0},
    lambda url: {"url": url, "streams": "btcusdt@trade,btcusdt@depth@100ms"},
    10,
)
KR = Feed("kr-1", "kraken-v2", {"rate": 5.0}, lambda url: {"url": url, "symbols": "BTC/USD,ETH/USD"}, 10)
AL = Feed(
    "al-1",
    "alpaca",
    {"rate": 5.0, "key": ALPACA_KEY, "secret": ALPACA_SECRET},
    lambda url: {
        "url": url,
        "key": "{{env:FEEDS_ALPACA_KEY}}",
        "secret": "{{env:FEEDS_ALPACA_SECRET}}",
        "symbols": "AAPL,MSFT",
    },
    10,
)
HA = Feed(
    "ha-1",
    "home-assistant",
    {"rate": 5.0, "token": HA_TOKEN},
    lambda url: {"url": url, "token": "{{env:FEEDS_HA_TOKEN}}"},
    10,
)
FEEDS = (JS, CB, BN, KR, AL, HA)
NOT_REPLAYABLE = (CB, BN, KR, AL, HA)
LOSS_IN_SOCKET = (CB, KR)  # Binance's trade streams, Alpaca and Home Assistant cannot tell one
CIDS = tuple(feed.cid for feed in FEEDS)

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
        running.start({feed.preset: feed.replay for feed in FEEDS})
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


def keyed_markers(arrivals: list[Arrival], cid: str) -> list[Arrival]:
    return [a for a in arrivals if a.cid == cid and a.record["kind"] == "gap" and a.record["data"].get("key")]


def open_sockets(ledger: list[Entry]) -> set[int]:
    return {e.conn for e in ledger if e.kind == "open"} - {e.conn for e in ledger if e.kind == "close"}


def item(fleet: FeedsFleet, cid: str) -> dict[str, Any]:
    items: list[dict[str, Any]] = fleet.admin.call(lambda admin: admin.list())
    return next(i for i in items if i["connection_id"] == cid)


@pytest.mark.parametrize(("mode", "fault"), CASES)
def test_real_feeds_across_a_fault(fleet: FeedsFleet, mode: str, fault: str) -> None:
    assert fleet.replays is not None
    servers = fleet.replays.servers
    configs = {
        feed.cid: fleet.add_preset(feed.cid, feed.preset, feed.params(servers[feed.preset].url))
        for feed in FEEDS
    }

    # w1 alone takes all; its long reconcile keeps it from handing one back before the fault.
    w1 = fleet.start_worker("w1", {"RECONCILE_SECONDS": "30", **SECRETS_ENV})
    wait_until(lambda: {o for o, _ in fleet.leases().values()} == {"w1"}, 30, "w1 to own all six")
    wait_until(
        lambda: all(data_count(fleet, feed.cid, "w1") >= feed.warm for feed in FEEDS),
        20,
        "w1 delivering every feed",
    )
    # An upstream's own loss inside a socket: the next frame of each feed whose ids show it
    # (Coinbase's and Kraken's trade ids) is never sent; the owner marks it with a keyed seq_gap.
    for feed in LOSS_IN_SOCKET:
        fleet.replays.skip(feed.preset, 1)
    wait_until(
        lambda: all(keyed_markers(fleet.tailer.arrivals(), feed.cid) for feed in LOSS_IN_SOCKET),
        10,
        "keyed seq_gap markers of the skipped frames",
    )
    w2 = fleet.start_worker("w2", SECRETS_ENV)
    wait_until(lambda: fleet.session("w2") is not None, 30, "w2's session")
    time.sleep(1.5)  # w2's loops (listing, hints) are running
    before = fleet.leases()
    assert {owner for owner, _ in before.values()} == {"w1"}, f"w1 handed one back before the fault: {before}"
    alpaca_open = open_sockets(fleet.replays.ledger("alpaca"))

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
        "w2 to own all at a higher epoch",
    )
    # Alpaca's new owner cannot subscribe while the paused owner's socket holds the key's one
    # connection: it waits for SIGCONT (below).
    prompt = [cid for cid in CIDS if not (fault == "stop" and cid == AL.cid)]
    wait_until(
        lambda: all(first_of_epoch(fleet.tailer.arrivals(), cid, before[cid][1]) for cid in prompt),
        15,
        "records of the new epochs",
    )
    woken_ms = fault_ms
    if fault == "stop":
        wait_until(lambda: bool((fleet.session("w1") or {}).get("fenced_by")), 15, "w1's session fenced")
        session = fleet.session("w1") or {}
        assert not str(session.get("fenced_by", "")).startswith("supervisor:"), session
        assert w1.popen.poll() is None, "a paused child is not a dead one"
        # The limit refusal: w2 opened sockets to Alpaca while the paused one was open, was sent
        # nothing on them (406 "connection limit exceeded"), and shows why, not failed.
        wait_until(
            lambda: "connection limit exceeded" in str(item(fleet, AL.cid).get("last_error", "")),
            15,
            "alpaca's last_error to show the 406",
        )
        assert first_of_epoch(fleet.tailer.arrivals(), AL.cid, before[AL.cid][1]) is None
        lingering = open_sockets(fleet.replays.ledger("alpaca")) & alpaca_open
        assert lingering, "the paused owner's socket lingers upstream"
        woken_ms = time.time_ns() // 1_000_000
        os.kill(child, signal.SIGCONT)
        assert fleet.wait_exit("w1", 15) == EXIT_FENCED, w1.tail()
        # Its backoff doubles at most each attempt: the next one comes within the cap.
        wait_until(
            lambda: first_of_epoch(fleet.tailer.arrivals(), AL.cid, before[AL.cid][1]) is not None,
            BACKOFF_CAP_S + CONNECT_ALLOWANCE_S,
            "alpaca's new owner to subscribe once the old socket went",
        )
    arrivals_now = fleet.tailer.arrivals()
    taken = {
        cid: ((first_of_epoch(arrivals_now, cid, before[cid][1]) or 0) - fault_ms) / 1000 for cid in CIDS
    }
    time.sleep(DELIVER_AFTER_S)
    os.kill(w2.popen.pid, signal.SIGTERM)
    assert fleet.wait_exit("w2", 15) == 0, w2.tail()
    arrivals = fleet.tailer.stop()
    fleet.replays.stop()  # the ledgers are complete
    ledgers = {feed.cid: fleet.replays.ledger(feed.preset) for feed in FEEDS}
    for feed in FEEDS:
        fleet.save_ledger(
            feed.preset, ledgers[feed.cid]
        )  # beside the sink and logs, for a failure's evidence
    upstreams = {
        feed.cid: Upstream(
            ledgers[feed.cid],
            servers[feed.preset].t0_wall_ms,
            tapes_of(feed.preset, float(feed.replay["rate"])),
            configs[feed.cid],
        )
        for feed in NOT_REPLAYABLE
    }

    # The tailer saw every line of every sink file.
    on_disk = sum(len(p.read_text().splitlines()) for p in fleet.sink_dir.glob("*.jsonl"))
    assert on_disk == len(arrivals), (on_disk, len(arrivals))

    def judge(copy: list[Arrival], cids: tuple[str, ...] = CIDS) -> list[str]:
        violations: list[str] = []
        for cid in cids:
            mine = [a for a in copy if a.cid == cid]
            violations += check_s1(mine) + check_seqs(mine)
            if cid == JS.cid:
                violations += check_replayable(mine, cid, ledgers[cid]) + check_consumer(mine, cid)
            else:
                upstream = upstreams[cid]
                violations += check_not_replayable(mine, cid, upstream)
                violations += check_consumer(mine, cid, upstream.identity)
        return violations

    violations = judge(arrivals)
    summary = summarise(arrivals, before, taken, upstreams)
    if fault == "stop":
        summary["al_after_sigcont_s"] = round(
            ((first_of_epoch(arrivals, AL.cid, before[AL.cid][1]) or 0) - woken_ms) / 1000, 2
        )
    print(f"\nfeeds {mode} {fault}: {summary}")
    assert not violations, (violations[:20], summary)

    # Each epoch of a feed that cannot replay starts with its socket's marker.
    for feed in NOT_REPLAYABLE:
        for epoch in sorted({a.epoch for a in arrivals if a.cid == feed.cid}):
            first = next(a.record for a in arrivals if a.cid == feed.cid and a.epoch == epoch and a.seq == 0)
            expected = "connect" if epoch == before[feed.cid][1] else "takeover"
            assert first["kind"] == "gap" and first["data"]["reason"] == expected, first
    # Two epochs each, both delivered; Alpaca's refusals never failed it.
    for cid in CIDS:
        assert {a.epoch for a in arrivals if a.cid == cid} == {before[cid][1], before[cid][1] + 1}, cid
    assert item(fleet, AL.cid)["desired_state"] == "STARTED", item(fleet, AL.cid)
    if fault == "stop":
        refused = [
            e.conn
            for e in ledgers[AL.cid]
            if e.kind == "open"
            and fault_ms <= e.t_ms <= woken_ms
            and not upstreams[AL.cid].by_socket.get(e.conn)
        ]
        assert refused, "no Alpaca socket was refused while the paused owner's lingered"
    if fault == "term":  # a graceful handoff replays nothing
        for feed in FEEDS:
            held = [
                (a.record.get("key"), a.record["cursor"])
                if feed is JS
                else upstreams[feed.cid].identity(a.record)
                for a in arrivals
                if a.cid == feed.cid and a.record["kind"] == "data"
            ]
            assert len(held) == len(set(held)), f"{feed.cid}: replayed across a graceful handoff"
        assert max(taken.values()) <= L2_BOUND_S, taken
    elif fault == "kill":
        assert max(taken.values()) <= FENCE_PATH_S + CONNECT_ALLOWANCE_S, taken
    else:
        assert max(s for cid, s in taken.items() if cid != AL.cid) <= L1_BOUND_S[mode], taken

    # The resolved secrets reached the replays (they authenticated) and nothing else here.
    written = [*fleet.sink_dir.glob("*.jsonl"), *fleet.logs.glob("*.log")]
    for path in written:
        text = path.read_text(errors="replace")
        for value in SECRETS_ENV.values():
            assert value not in text, f"a secret value in {path.name}"

    negative_controls(arrivals, judge, before, upstreams)


def negative_controls(
    arrivals: list[Arrival],
    judge: Callable[[list[Arrival], tuple[str, ...]], list[str]],
    before: dict[str, tuple[str | None, int]],
    upstreams: dict[str, Upstream],
) -> None:
    """The checks fail on doctored copies of this run's own sink output."""
    old_js = before[JS.cid][1]
    js_count: dict[Any, int] = {}
    for a in arrivals:
        if a.cid == JS.cid:
            js_count[a.record["cursor"]] = js_count.get(a.record["cursor"], 0) + 1
    # 1. One Jetstream event, delivered once, removed: lost, a seq hole, and the consumer (who
    #    waits for the missing seq) yields nothing of that epoch after it.
    copy, dropped = drop_one(
        arrivals, lambda a: a.cid == JS.cid and a.seq == 10 and js_count[a.record["cursor"]] == 1
    )
    found = judge(copy, (JS.cid,))
    assert any(f"never reached the sink, first [{dropped.record['cursor']}" in v for v in found), found
    assert f"seq {JS.cid} epoch {dropped.epoch}: 1 seqs missing, first [10]" in found, found
    assert any(v.startswith(f"consumer {JS.cid}") for v in found), found

    # 2, 3. Every feed that cannot replay, an event dropped and a marker withheld.
    holed = [
        feed.cid
        for feed in NOT_REPLAYABLE
        if doctor_not_replayable(arrivals, judge, feed.cid, before[feed.cid][1], upstreams[feed.cid])
    ]
    assert holed, "no feed lost anything at the takeover: the withheld-marker control never ran"

    # 4. A record of the old epoch written again after the new epoch's: S1 (caught by the arbiter
    #    alone: its received_at_ms is as early as it was).
    copy = move_late(arrivals, lambda a: a.cid == JS.cid and a.epoch == old_js)
    found = judge(copy, (JS.cid,))
    assert any(v.startswith(f"S1 {JS.cid}: epoch {old_js}") for v in found), found


def doctor_not_replayable(
    arrivals: list[Arrival],
    judge: Callable[[list[Arrival], tuple[str, ...]], list[str]],
    cid: str,
    old_epoch: int,
    upstream: Upstream,
) -> bool:
    """The not-replayable checks fail when an event is dropped and when a marker is withheld;
    returns whether the feed lost anything at the takeover (else there is no marker to withhold:
    Kraken's snapshot usually covers the takeover)."""
    count: dict[Any, int] = {}
    for a in arrivals:
        if a.cid == cid and a.record["kind"] == "data":
            told = upstream.identity(a.record)
            count[told] = count.get(told, 0) + 1
    # 2. An event dropped: one record in the middle of a socket removed (the first owner's and
    #    the new owner's): missing while connected, and an unmarked hole.
    for epoch, min_seq in ((old_epoch, 12), (old_epoch + 1, 5)):
        dropped = mid_socket(arrivals, cid, epoch, min_seq, upstream, count)
        copy = [a for a in arrivals if a is not dropped]
        told = upstream.identity(dropped.record)
        assert told is not None
        key, n = told
        sent = upstream.sends(dropped.record)[0]
        found = judge(copy, (cid,))
        assert any("never arrived" in v and repr((key, sent.cursor)) in v for v in found), (cid, found)
        assert any(f"key {key} items {n}..{n} missing with no gap marker" in v for v in found), (cid, found)

    # An event no socket was sent (the same record, its content altered): invented.
    copy, _ = change_one(
        arrivals, lambda a: a is dropped, lambda r: {**r, "data": {**r["data"], "doctored": 1}}
    )
    found = judge(copy, (cid,))
    assert any("delivered but never sent" in v for v in found), (cid, found)

    # A keyed seq_gap marker (the skipped frame's) removed: an unmarked hole inside a socket.
    keyed = keyed_markers(arrivals, cid)
    if keyed:
        copy, dropped = drop_one(arrivals, lambda a: a is keyed[0])
        found = judge(copy, (cid,))
        unmarked = f"key {dropped.record['data']['key']} items"
        assert any(unmarked in v and "missing with no gap marker" in v for v in found), (cid, found)

    # 3. The takeover marker removed where items were lost at the takeover: an unmarked hole.
    lost_keys = takeover_holes(arrivals, cid, old_epoch, upstream)
    if not lost_keys:
        return False
    takeover_marker = lambda a: a.cid == cid and a.epoch > old_epoch and a.seq == 0  # noqa: E731
    copy, dropped = drop_one(arrivals, takeover_marker)
    assert dropped.record["data"]["reason"] == "takeover"
    found = judge(copy, (cid,))
    lost_key, last_lost = lost_keys[0]
    unmarked = f"key {lost_key} items"
    assert any(unmarked in v and "missing with no gap marker" in v for v in found), (cid, found)
    # The marker kept, but its until_ms moved to just before the last lost item existed upstream:
    # it no longer bounds the hole.
    too_early = int(upstream.existed_ms(lost_key, last_lost)) - TAPE_SLACK_MS - 1
    copy, _ = change_one(
        arrivals, takeover_marker, lambda r: {**r, "data": {**r["data"], "until_ms": too_early}}
    )
    found = judge(copy, (cid,))
    assert any(unmarked in v and "missing with no gap marker" in v for v in found), (cid, found)
    return True


def mid_socket(
    arrivals: list[Arrival], cid: str, epoch: int, min_seq: int, upstream: Upstream, count: dict[Any, int]
) -> Arrival:
    """A record of `epoch` at `min_seq` or later, delivered once, in the middle of its key's run:
    its key's previous record, with no marker between, is the item before it and was the
    highest of its key so far (a socket's first records are not: what its marker covers has no
    lower bound, or begins at the previous owner's last delivered; only the ledger shows a loss
    there)."""
    top: dict[Any, int] = {}  # per key, the highest item so far
    fresh: dict[Any, int] = {}  # per key, the item of its last record, when that raised `top`
    for a in arrivals:
        if a.cid != cid:
            continue
        if a.record["kind"] == "gap":
            fresh.clear()
            continue
        told = upstream.identity(a.record)
        if a.record["kind"] != "data" or told is None:
            continue
        key, n = told
        if a.epoch == epoch and a.seq >= min_seq and count[told] == 1 and fresh.get(key) == n - 1:
            return a
        if n > top.get(key, n - 1):
            top[key] = fresh[key] = n
        else:
            fresh.pop(key, None)
    raise AssertionError(f"{cid} epoch {epoch}: no record in the middle of a socket to drop")


def takeover_holes(
    arrivals: list[Arrival], cid: str, old_epoch: int, upstream: Upstream
) -> list[tuple[Any, int]]:
    """The keys whose items were lost between the old epoch's last and the new epoch's first,
    each with the number of its last lost item."""
    told = [
        (upstream.identity(a.record), a.epoch)
        for a in arrivals
        if a.cid == cid and a.record["kind"] == "data"
    ]
    keys = {t[0] for t, _ in told if t is not None}
    holed = []
    for key in sorted(keys, key=str):
        old = [t[1] for t, e in told if t is not None and t[0] == key and e == old_epoch]
        new = [t[1] for t, e in told if t is not None and t[0] == key and e > old_epoch]
        if old and new and max(old) + 1 < min(new):
            holed.append((key, min(new) - 1))
    return holed


def summarise(
    arrivals: list[Arrival],
    before: dict[str, tuple[str | None, int]],
    taken: dict[str, float],
    upstreams: dict[str, Upstream],
) -> dict[str, Any]:
    summary: dict[str, Any] = {"takeover_s": {cid: round(s, 2) for cid, s in taken.items()}}
    for cid in CIDS:
        mine = [a.record for a in arrivals if a.cid == cid]
        upstream = upstreams.get(cid)
        data = [
            (r.get("key"), r["cursor"]) if upstream is None else upstream.identity(r)
            for r in mine
            if r["kind"] == "data"
        ]
        summary[cid] = {
            "records": len(mine),
            "data": len(data),
            "replayed": len(data) - len(set(data)),
            "markers": [
                (r["epoch"], r["data"]["reason"], *([r["data"]["key"]] if r["data"].get("key") else []))
                for r in mine
                if r["kind"] == "gap"
            ],
        }
        if upstream is not None:
            summary[cid]["missing"] = missing_items(arrivals, cid, upstream)
    return summary
