"""The checks the real-feed system tests (test_feeds.py) judge a run by, from outside the worker.

They take the sink tailer's arrivals (feeds_fleet.py: every record, in the order the tailer
proved) and the replays' ledgers (leaseworker_dev.feed.replays: what the upstream SENT, per socket),
and return violations (strings), so that a test can show they fail on doctored output (the
negative controls).

A feed that cannot replay is judged by one checker for every preset (`check_not_replayable`),
from its replay's ledger, where each data entry names its socket (`conn`), its `key` (product,
symbol, stream; None for Home Assistant) and its `cursor` (the upstream's id: a trade id, a
depth update's last id `u`, an Alpaca trade id `i`, a Home Assistant event's number). A delivered
record is traced to the entries that sent it by its content: the record's `data` is the ledger's
`message`, or the member its preset unwraps (`frames.unwrap`: Home Assistant's `/event`). The
record's own `key` and `cursor` are not enough: Alpaca's and Home Assistant's presets have no
cursor, and Binance's trade streams none that the preset reads. Where an item sits in its key's
stream comes from the replay's tape (`Tapes`): item n of a key exists from t0 + n / rate, so a
hole is a run of numbers, delivered to no one or lost, whichever socket was up.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from leaseworker.consumer import ConnectionFilter
from leaseworker.protocol.generic.pointers import MISSING, resolve
from leaseworker_dev.feed.replays import Entry, alpaca, binance, coinbase, kraken

TAPE_SLACK_MS = 50  # a replay's tape maps its monotonic start to the wall clock once


@dataclass(frozen=True, slots=True)
class Arrival:
    record: dict[str, Any]
    file: str
    line: int  # in its file, from 0
    seen: int  # the tailer's read that first saw the line
    unseen: int  # the previous read of the same file (which did not see it); -1: none

    @property
    def cid(self) -> str:
        return str(self.record["connection_id"])

    @property
    def epoch(self) -> int:
        return int(self.record["epoch"])

    @property
    def seq(self) -> int:
        return int(self.record["seq"])


# ----------------------------------------------------------------------------- every feed


def by_connection(arrivals: Iterable[Arrival]) -> dict[str, list[Arrival]]:
    grouped: dict[str, list[Arrival]] = defaultdict(list)
    for arrival in arrivals:
        grouped[arrival.cid].append(arrival)
    return dict(grouped)


def certainly_after(later: Arrival, earlier: Arrival) -> bool:
    """`later` was written after `earlier`, as the tailer's reads prove."""
    if later.file == earlier.file:
        return later.line > earlier.line
    return earlier.seen < later.unseen


def check_s1(arrivals: Sequence[Arrival]) -> list[str]:
    """S1 (docs/design.md §2c): no record of epoch e arrives after one of a higher epoch.

    Judged twice: in the tailer's arrival order (only what its reads prove), and on the one
    clock every process here shares (`received_at_ms`: everything of epoch e was received before
    anything of a higher epoch)."""
    violations: list[str] = []
    for cid, items in by_connection(arrivals).items():
        epochs = sorted({a.epoch for a in items})
        for epoch in epochs:
            lower = [a for a in items if a.epoch == epoch]
            higher = [a for a in items if a.epoch > epoch]
            if not higher:
                continue
            first_higher = min(higher, key=lambda a: a.seen)
            for item in lower:
                late = [h for h in higher if certainly_after(item, h)]
                if late:
                    violations.append(
                        f"S1 {cid}: epoch {epoch} seq {item.seq} ({item.file}:{item.line + 1}) "
                        f"arrived after epoch {late[0].epoch} seq {late[0].record['seq']} "
                        f"({late[0].file}:{late[0].line + 1})"
                    )
                    break
            last_received = max(int(a.record["received_at_ms"]) for a in lower)
            first_received = min(int(a.record["received_at_ms"]) for a in higher)
            if last_received > first_received:
                violations.append(
                    f"S1 {cid}: epoch {epoch} received a record at {last_received} ms, after a higher "
                    f"epoch's first at {first_received} ms (first seen in {first_higher.file})"
                )
    return violations


def check_seqs(arrivals: Sequence[Arrival]) -> list[str]:
    """generic/1 numbering: within each epoch, seq covers 0..max with no hole."""
    violations: list[str] = []
    seqs: dict[tuple[str, int], set[int]] = defaultdict(set)
    for a in arrivals:
        seqs[(a.cid, a.epoch)].add(int(a.record["seq"]))
    for (cid, epoch), found in sorted(seqs.items()):
        missing = sorted(set(range(max(found) + 1)) - found)
        if missing:
            violations.append(f"seq {cid} epoch {epoch}: {len(missing)} seqs missing, first {missing[:5]}")
    return violations


def consumer_view(arrivals: Sequence[Arrival]) -> list[dict[str, Any]]:
    """What a consumer keeps: the records in arrival order through ConnectionFilter."""
    consumer = ConnectionFilter()
    return [a.record for a in arrivals if consumer.admit(a.record)]


Identity = Callable[[dict[str, Any]], tuple[Any, Any] | None]  # a data record -> (key, its order)


def record_cursor(record: dict[str, Any]) -> tuple[Any, Any]:
    return record.get("key"), record["cursor"]


def check_consumer(arrivals: Sequence[Arrival], cid: str, identity: Identity = record_cursor) -> list[str]:
    """After the filter, each upstream message once and in order (per key): exactly the set of
    messages the sink holds, ascending. A message is told by `identity`: by default the record's
    own key and cursor; for a feed whose records carry no cursor, what its upstream sent
    (`Upstream.identity`)."""
    violations: list[str] = []
    mine = [a for a in arrivals if a.cid == cid]
    kept = [identity(r) for r in consumer_view(mine) if r["kind"] == "data"]
    held: dict[Any, set[Any]] = defaultdict(set)
    for a in mine:
        if a.record["kind"] == "data":
            told = identity(a.record)
            if told is not None:
                held[told[0]].add(told[1])
    for key, orders in held.items():
        yielded = [told[1] for told in kept if told is not None and told[0] == key]
        if yielded != sorted(orders):
            twice = sorted({c for c in yielded if yielded.count(c) > 1})[:5]
            lost = sorted(orders - set(yielded))[:5]
            disorder = [(x, y) for x, y in itertools.pairwise(yielded) if y <= x][:3]
            violations.append(
                f"consumer {cid} key {key}: {len(yielded)} yielded of {len(orders)} held; "
                f"twice {twice}, never {lost}, out of order {disorder}"
            )
    return violations


# ----------------------------------------------------------------------------- a feed that can replay


def check_replayable(arrivals: Sequence[Arrival], cid: str, ledger: Sequence[Entry]) -> list[str]:
    """A feed that can replay (Jetstream): every message the upstream SENT, on any socket, up to
    the last one delivered reaches the sink, nothing arrives that it never sent, and no gap
    marker is needed."""
    violations: list[str] = []
    mine = [a.record for a in arrivals if a.cid == cid]
    markers = [r for r in mine if r["kind"] != "data"]
    if markers:
        violations.append(f"replayable {cid}: {len(markers)} non-data records, first {markers[0]}")
    delivered = {r["cursor"] for r in mine if r["kind"] == "data"}
    if not delivered:
        return [*violations, f"replayable {cid}: nothing delivered"]
    last = max(delivered)
    sent = {e.cursor for e in ledger if e.kind == "data"}
    lost = sorted(c for c in sent if c <= last and c not in delivered)
    if lost:
        violations.append(
            f"replayable {cid}: {len(lost)} sent messages up to the last delivered ({last}) never "
            f"reached the sink, first {lost[:5]}"
        )
    invented = sorted(delivered - sent)
    if invented:
        violations.append(f"replayable {cid}: delivered but never sent: {invented[:5]}")
    return violations


# ----------------------------------------------------------------------------- feeds that cannot


@dataclass(frozen=True, slots=True)
class Tapes:
    """How a replay numbers its items: a ledger entry's (key, cursor) is item `index` of its
    key's tape, and item n of key k exists upstream from t0 + n / `rate(k)` (replays/base.py)."""

    index: Callable[[str | None, Any], int]
    rate: Callable[[str | None], float]


def _alpaca_index(symbol: str | None, trade_id: Any) -> int:
    base = int(alpaca.trade("", 0)["i"])  # i = base + 3n + n % 2: increasing, not consecutive
    n = (int(trade_id) - base) // 3
    assert alpaca.trade(str(symbol), n)["i"] == trade_id, (symbol, trade_id)
    return n


def _binance_index(stream: str | None, last_id: Any) -> int:
    if str(stream).endswith("@trade"):
        return int(last_id) - binance.TRADE_ID_BASE
    span = binance.UPDATE_IDS_PER_EVENT  # depth event n: ids BASE + span * n .. + span - 1
    return (int(last_id) - binance.UPDATE_ID_BASE - (span - 1)) // span


def tapes_of(feed: str, rate: float) -> Tapes:
    """The numbering of each replay that cannot replay, read from its module."""
    same = lambda key: rate  # noqa: E731 (every key trades at the server's rate)
    if feed == "coinbase-exchange":
        return Tapes(lambda key, cursor: int(cursor) - coinbase.TRADE_ID_BASE, same)
    if feed == "kraken-v2":
        return Tapes(lambda key, cursor: int(cursor) - kraken.TRADE_ID_BASE, same)
    if feed == "alpaca":
        return Tapes(_alpaca_index, same)
    if feed == "home-assistant":
        return Tapes(lambda key, cursor: int(cursor), same)
    if feed == "binance-spot":
        # Trades at the server's rate; depth at 10 per second (@100ms) or 1 (binance.py).
        return Tapes(
            _binance_index,
            lambda stream: (
                rate if str(stream).endswith("@trade") else 10.0 if str(stream).endswith("@100ms") else 1.0
            ),
        )
    raise ValueError(f"no tape numbering for {feed}")


def _content(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Sent:
    conn: int
    key: str | None
    cursor: Any
    n: int


@dataclass
class Upstream:
    """One feed that cannot replay, as its replay saw it: the ledger, the tapes, and the
    connection's generic/1 config (its `frames.unwrap` is what a record's `data` is of a ledger
    message; its `gaps.first`, a record's first id for a keyed range marker)."""

    ledger: Sequence[Entry]
    t0_wall_ms: int
    tapes: Tapes
    config: dict[str, Any]
    sent_by: dict[str, list[Sent]] = field(init=False)  # content -> the sends of it
    by_socket: dict[int, list[Sent]] = field(init=False)  # socket -> its sends, in send order
    opened: dict[int, int] = field(init=False)  # socket -> wall ms

    def __post_init__(self) -> None:
        unwrap = self.config.get("frames", {}).get("unwrap")
        self.sent_by = defaultdict(list)
        self.by_socket = defaultdict(list)
        for entry in self.ledger:
            if entry.kind != "data":
                continue
            sent = Sent(entry.conn, entry.key, entry.cursor, self.tapes.index(entry.key, entry.cursor))
            delivered_as = entry.message if unwrap is None else resolve(entry.message, unwrap)
            assert delivered_as is not MISSING, (unwrap, entry)
            self.sent_by[_content(delivered_as)].append(sent)
            self.by_socket[entry.conn].append(sent)
        self.opened = {e.conn: e.t_ms for e in self.ledger if e.kind == "open"}

    def sends(self, record: dict[str, Any]) -> list[Sent]:
        return self.sent_by.get(_content(record["data"]), [])

    def identity(self, record: dict[str, Any]) -> tuple[str | None, int] | None:
        """A data record's (ledger key, item number), whichever socket sent it; None: never sent."""
        sends = self.sends(record)
        return (sends[0].key, sends[0].n) if sends else None

    def existed_ms(self, key: str | None, n: int) -> float:
        return self.t0_wall_ms + n * 1000 / self.tapes.rate(key)

    def first_id(self, record: dict[str, Any]) -> Any:
        """The first upstream id a record covers: `gaps.first` (Binance depth `U`), else its cursor."""
        first = self.config.get("gaps", {}).get("first")
        found = MISSING if first is None else resolve(record["data"], first)
        return record["cursor"] if found is MISSING else found


def check_not_replayable(arrivals: Sequence[Arrival], cid: str, upstream: Upstream) -> list[str]:
    """A feed that cannot replay (docs/design.md §2c S2, §4.3), judged from its replay's ledger:

    - nothing is delivered that no socket was sent (by content);
    - per socket: everything the upstream sent on a socket, up to the last record delivered
      from that socket (in the socket's send order, every key), is delivered (the records
      between two socket markers are traced to the one socket that was sent all of them, by
      their whole content, times included). Items of a look back (Kraken's snapshot) at or below
      what earlier sockets delivered of their key are history, not sent while connected: the
      worker drops them below its cursor, and one never delivered is an earlier hole, judged
      next;
    - every item missing from the sink (per key, between the first and the last delivered on
      the key's tape) lies inside a gap marker placed before the next delivered item of the key
      in arrival order:
      * a keyed marker (`key`) whose from_cursor is at or below the last id before the hole and
        whose to_cursor is at or above the last id in it (a record's seq_gap names the first id
        after the hole; a heartbeat's, from Coinbase's `last_trade_id`, the last one in it);
      * or a marker of the whole connection (connect, takeover, reconnect, idle) whose
        from_cursor (the `{key: cursor}` map it resumed from) is at or below the record before
        the hole, and whose until_ms is no earlier than the time the last missing item existed
        upstream.
    """
    violations: list[str] = []
    mine = [a.record for a in arrivals if a.cid == cid]
    delivered: set[tuple[str | None, int]] = set()
    runs: list[tuple[int, list[Sent], dict[str | None, int]]] = []  # socket, its sends, history
    earlier: dict[str | None, int] = {}  # per key, the highest item the runs so far delivered
    for run in socket_runs(mine):
        candidates: set[int] | None = None
        for record in run:
            sends = upstream.sends(record)
            if not sends:
                violations.append(
                    f"not-replayable {cid}: delivered but never sent: epoch {record['epoch']} seq "
                    f"{record['seq']} key {record.get('key')} cursor {record['cursor']}"
                )
                continue
            delivered.add((sends[0].key, sends[0].n))
            sockets = {s.conn for s in sends}
            candidates = sockets if candidates is None else candidates & sockets
        if not candidates:
            if candidates is not None:
                violations.append(
                    f"not-replayable {cid}: the run from epoch {run[0]['epoch']} seq {run[0]['seq']} "
                    "mixes messages that no one socket was sent"
                )
            continue
        # One message sent to two sockets in the same millisecond (a paused owner's socket is
        # still open upstream while its successor subscribes) has the same content on both: the
        # run is the latest of them opened before the run's first record arrived.
        first_ms = int(run[0]["received_at_ms"])
        opened = upstream.opened
        conn = max(candidates, key=lambda c: (opened.get(c, 0) <= first_ms, opened.get(c, 0)))
        sends = [s for record in run for s in upstream.sends(record) if s.conn == conn]
        runs.append((conn, sends, dict(earlier)))
        for sent in sends:
            earlier[sent.key] = max(sent.n, earlier.get(sent.key, sent.n))
    for conn, sends, history in runs:
        on_socket = upstream.by_socket[conn]
        position = {s: i for i, s in enumerate(on_socket)}
        last = max(position[s] for s in sends)
        unsent = [
            (s.key, s.cursor)
            for s in on_socket[: last + 1]
            if (s.key, s.n) not in delivered and s.n > history.get(s.key, s.n - 1)
        ]
        if unsent:
            at = on_socket[last]
            violations.append(
                f"not-replayable {cid}: socket {conn} was sent {unsent[:5]} (of {len(unsent)}) before "
                f"its last delivered one ({at.key} {at.cursor}), and they never arrived"
            )
    violations.extend(_unmarked_holes(mine, cid, upstream, {key for key, _ in delivered}))
    return violations


def _unmarked_holes(
    mine: Sequence[dict[str, Any]], cid: str, upstream: Upstream, keys: set[str | None]
) -> list[str]:
    """Every hole bounded by a marker, in arrival order."""
    violations: list[str] = []
    last_of: dict[str | None, tuple[int, dict[str, Any]]] = {}  # key -> (highest n, its record)
    markers_since: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for record in mine:
        if record["kind"] == "gap":
            for key in keys:
                markers_since[key].append(record["data"])
            continue
        told = upstream.identity(record) if record["kind"] == "data" else None
        if told is None:
            continue
        key, n = told
        before = last_of.get(key)
        if before is not None and n > before[0] + 1:
            previous = before[1]
            covering = [m for m in markers_since[key] if _covers(m, upstream, key, n, previous, record)]
            if not covering:
                violations.append(
                    f"not-replayable {cid}: key {key} items {before[0] + 1}..{n - 1} missing with no "
                    f"gap marker bounding them (between cursors {previous['cursor']} and "
                    f"{record['cursor']}; markers since: {markers_since[key][:3]})"
                )
        if before is None or n > before[0]:
            last_of[key] = (n, record)
            markers_since[key] = []
    return violations


def _covers(
    marker: dict[str, Any],
    upstream: Upstream,
    key: str | None,
    n: int,
    previous: dict[str, Any],
    after: dict[str, Any],
) -> bool:
    """Does this gap marker bound the hole before item n of `key` (record `after`), which
    follows record `previous`?"""
    record_key = after.get("key")
    if marker.get("key") is not None:
        low, high, first = marker.get("from_cursor"), marker.get("to_cursor"), upstream.first_id(after)
        return (
            marker["key"] == record_key
            and all(isinstance(v, int) for v in (low, high, previous["cursor"], first))
            and low <= previous["cursor"]
            and high >= first - 1
        )
    since = marker.get("from_cursor")
    if isinstance(since, dict):
        since = since.get(record_key) if record_key is not None else None
    elif record_key is not None:
        since = None
    if isinstance(since, int) and isinstance(previous["cursor"], int) and since > previous["cursor"]:
        return False
    until = marker.get("until_ms")
    return isinstance(until, int) and upstream.existed_ms(key, n - 1) <= until + TAPE_SLACK_MS


def socket_runs(records: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The data records of a feed that cannot replay, cut into one run per socket: a socket's
    records start after its marker of the whole connection (connect, takeover, reconnect, idle:
    docs/design.md §4.3), and never span two epochs."""
    runs: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    epoch: Any = None
    for record in records:
        starts = record["kind"] == "gap" and record["data"].get("key") is None
        if starts or record["epoch"] != epoch:
            if current:
                runs.append(current)
            current = []
            epoch = record["epoch"]
        if record["kind"] == "data":
            current.append(record)
    if current:
        runs.append(current)
    return runs


def missing_items(arrivals: Sequence[Arrival], cid: str, upstream: Upstream) -> dict[str, int]:
    """Per key, the items between the first and the last delivered that never arrived."""
    found: dict[str | None, set[int]] = defaultdict(set)
    for a in arrivals:
        if a.cid == cid and a.record["kind"] == "data":
            told = upstream.identity(a.record)
            if told is not None:
                found[told[0]].add(told[1])
    return {str(key): max(ns) - min(ns) + 1 - len(ns) for key, ns in found.items()}


# ----------------------------------------------------------------------------- doctored copies


def drop_one(arrivals: Sequence[Arrival], pick: Callable[[Arrival], bool]) -> tuple[list[Arrival], Arrival]:
    """A copy of the sink's output without the first line `pick` chooses (a negative control)."""
    for index, arrival in enumerate(arrivals):
        if pick(arrival):
            return [*arrivals[:index], *arrivals[index + 1 :]], arrival
    raise AssertionError("no line to drop for the negative control")


def change_one(
    arrivals: Sequence[Arrival],
    pick: Callable[[Arrival], bool],
    change: Callable[[dict[str, Any]], dict[str, Any]],
) -> tuple[list[Arrival], Arrival]:
    """A copy in which the first line `pick` chooses carries `change(record)` instead."""
    for index, arrival in enumerate(arrivals):
        if pick(arrival):
            doctored = replace(arrival, record=change(arrival.record))
            return [*arrivals[:index], doctored, *arrivals[index + 1 :]], arrival
    raise AssertionError("no line to change for the negative control")


def move_late(arrivals: Sequence[Arrival], pick: Callable[[Arrival], bool]) -> list[Arrival]:
    """A copy in which the line `pick` chooses is written again at the end of its file, after
    everything else the tailer saw (a deposed owner's late write)."""
    chosen = next(a for a in arrivals if pick(a))
    last_read = max(a.seen for a in arrivals)
    lines = max(a.line for a in arrivals if a.file == chosen.file)
    late = replace(chosen, line=lines + 1, seen=last_read + 2, unseen=last_read + 1)
    return [*arrivals, late]
