"""For consumers of the sink: effectively-once, in-order records per connection (docs/design.md §5).

The sink is at-least-once. A reader of the Kinesis stream sees, per connection:
- replays: after a takeover the new owner resumes from the checkpoint, which may lag what the
  old owner delivered. For `seqfeed/1` the replayed records carry the same seqs again, under the
  new epoch. For `generic/1` (and plugins) the worker numbers each epoch from 0, so a replayed
  upstream message carries a new seq, and only its cursor (the upstream's position: Jetstream
  `time_us`, a Coinbase `trade_id`) shows that it was delivered before;
- resends: the Kinesis sink resends, in order, a failed record and every later record of its
  connection (go-back-N, see leaseworker.sinks.kinesis), so a run may break and resume earlier;
- in the worst case, a write of a deposed owner that reached Kinesis only after the new owner's
  (a request Kinesis received in full but applied late): it carries the lower epoch.

`ConnectionFilter` turns that into each upstream message once, in order. Per connection id it
keeps the highest epoch seen, the last seq delivered (and whether it was delivered in that epoch),
and the last delivered ordered cursor (one per key, for records with `key`). The verdicts, in the
order they are tried:

1. STALE_EPOCH: the epoch is below the highest seen (a deposed deliverer). Dropped; the state is
   unchanged.
2. The seq, which is the sink's own numbering:
   - within an epoch whose numbering has started (a record of it was delivered or replayed): the
     seq must be the last one + 1. At or below it: DUPLICATE (a resend); past it: AHEAD (Kinesis
     accepted a record while an earlier one of its connection failed; the sink resends both, in
     order, so it comes again after the missing one).
   - the first record of an epoch (its epoch is above the highest seen, or nothing of the highest
     epoch has been delivered yet), where `last` is the last seq delivered in an earlier epoch:
     * a connection known to number each epoch from 0 (it has shown a record with a cursor, a
       key, or of kind `gap`/`raw`, which only `generic/1` and plugins produce): seq 0 starts the
       epoch; any later seq is AHEAD (its epoch's seq 0 failed and will be resent first).
     * otherwise (records without cursor, key or marker: `seqfeed/1`, whose seqs are the
       upstream's and continue across epochs, or a cursorless `generic/1` feed): seq `last + 1`
       continues the numbering and seq 0 starts a new one; `0 < seq <= last` is DUPLICATE (a
       `seqfeed/1` replay from the checkpoint); a seq past `last + 1` is AHEAD.
       Seq 0 cannot be told apart: a `generic/1` epoch starts there, and so does a `seqfeed/1`
       takeover that found no checkpoint at all. It is accepted, because reading it as a
       duplicate would drop a whole `generic/1` epoch's start, while accepting it at worst
       delivers again the few records a `seqfeed/1` connection's first owner sent before its
       first checkpoint.
   A DUPLICATE or AHEAD record still raises the epoch: nothing of a lower epoch may follow it.
3. REPLAY: a record whose seq is the next one, of kind `data`, whose cursor is ordered and at or
   below the last delivered cursor of its key (of the connection, without a key). Dropped, but
   its seq counts as consumed, so the next seq is the one after it. A cursor is ordered when it is
   a number (compared as a number; not a bool) or a string (compared as a string, by code
   point); cursors of different types, or of any other JSON type, are not comparable, so never
   a replay. The filter cannot know a feed's `cursor.order`: a feed whose cursors are not
   ordered must leave `cursor.order` unset (`none`), and then the worker delivers `cursor: null`.
4. DELIVER: everything else whose seq is the next one. A `data` record with an ordered cursor
   moves its key's cursor; `gap` markers (a consumer must see every hole) and `raw` frames are
   delivered by seq alone and move no cursor.

So the at-least-once sink becomes effectively-once downstream for every protocol: `seqfeed/1`
by seq, and a replaying `generic/1` feed by cursor. A feed that cannot replay never repeats an
upstream message; it marks its holes with `gap` records instead.

Keep the filter's state with your own checkpoint (`positions()`, and `ConnectionFilter(positions)`
on restart; `Position.to_dict()`/`from_dict()` for JSON): the state is what makes a replay
recognisable. See docs/consumers.md.

Reading a whole stream in shard order (tools, tests, the docs) is leaseworker.stream_reader; a
production consumer uses the KCL, Lambda or its own shard iterators and only the filter.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from leaseworker.records import SinkRecord

# The Kinesis reader lives in stream_reader.py since 2026-12-07; consumers' code that imports it
# from here, as docs/consumers.md used to show, keeps working.
from leaseworker.stream_reader import StreamRecord, read_stream  # noqa: F401


class Verdict(Enum):
    DELIVER = "deliver"
    DUPLICATE = "duplicate"
    STALE_EPOCH = "stale_epoch"
    AHEAD = "ahead"
    REPLAY = "replay"


@dataclass(frozen=True, slots=True)
class Position:
    """Where a connection stands.

    - `epoch`: the highest epoch seen;
    - `seq`: the last seq delivered (or consumed by a REPLAY); -1: none;
    - `cursor`: the last ordered cursor delivered by a record without `key` (None: none);
    - `key_cursors`: the same per key, for records with `key`;
    - `in_epoch`: `seq` was delivered in `epoch`. False when `epoch` has been seen but none of its
      records delivered yet, so that `seq` is an earlier epoch's;
    - `per_epoch`: the connection has shown that its seqs restart at 0 in each epoch (`generic/1`
      and plugins: a record with a cursor, a key, or of kind `gap` or `raw`).

    `Position(epoch, seq)` is a v1 position, and still means what it meant."""

    epoch: int
    seq: int
    cursor: Any = None
    key_cursors: Mapping[str, Any] = field(default_factory=dict, hash=False)
    in_epoch: bool = True
    per_epoch: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the cursors are the records' own JSON values)."""
        body: dict[str, Any] = {"epoch": self.epoch, "seq": self.seq}
        if self.cursor is not None:
            body["cursor"] = self.cursor
        if self.key_cursors:
            body["key_cursors"] = dict(self.key_cursors)
        if not self.in_epoch:
            body["in_epoch"] = False
        if self.per_epoch:
            body["per_epoch"] = True
        return body

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> Position:
        """The inverse of to_dict(); a v1 `{"epoch", "seq"}` dict reads as before."""
        return cls(
            epoch=int(body["epoch"]),
            seq=int(body["seq"]),
            cursor=body.get("cursor"),
            key_cursors=dict(body.get("key_cursors") or {}),
            in_epoch=bool(body.get("in_epoch", True)),
            per_epoch=bool(body.get("per_epoch", False)),
        )


class _State:
    """A Position, mutable: a delivered keyed record updates one key, not a copy of all keys."""

    __slots__ = ("cursor", "epoch", "in_epoch", "key_cursors", "per_epoch", "seq")

    def __init__(self, position: Position) -> None:
        self.epoch = position.epoch
        self.seq = position.seq
        self.cursor: Any = position.cursor
        self.key_cursors: dict[str, Any] = dict(position.key_cursors)
        self.in_epoch = position.in_epoch
        self.per_epoch = position.per_epoch

    def position(self) -> Position:
        return Position(
            self.epoch, self.seq, self.cursor, dict(self.key_cursors), self.in_epoch, self.per_epoch
        )


def is_ordered(cursor: Any) -> bool:
    """A cursor the filter compares: a number (not a bool, not NaN) or a string."""
    if isinstance(cursor, bool):
        return False
    if isinstance(cursor, int | str):
        return True
    return isinstance(cursor, float) and not math.isnan(cursor)


def at_or_below(cursor: Any, last: Any) -> bool:
    """`cursor <= last` for two ordered cursors of one kind (numbers, or strings); False for
    anything not comparable: a replay is only ever declared on evidence."""
    if not (is_ordered(cursor) and is_ordered(last)):
        return False
    if isinstance(cursor, str) != isinstance(last, str):
        return False
    return bool(cursor <= last)


def _numbered_per_epoch(cursor: Any, kind: str, key: str | None) -> bool:
    # Only the session's own numbering (generic/1, plugins) produces these; seqfeed/1 never does.
    return cursor is not None or key is not None or kind != "data"


class ConnectionFilter:
    """Per connection id: deliver each upstream message once, in order, never from a lower epoch
    (the rules: this module's docstring).

    `first_seq` is the seq expected from a connection the filter has not seen: 0 (docs/design.md
    §4.1, §5: sequences start at 0) for a consumer that reads the stream from its start, or None to
    start from whatever record of that connection comes first (a consumer that joins a stream
    whose beginning it will never read).
    """

    def __init__(self, positions: Mapping[str, Position] | None = None, *, first_seq: int | None = 0) -> None:
        self._states: dict[str, _State] = {cid: _State(p) for cid, p in (positions or {}).items()}
        self._first_seq = first_seq
        self.counts: Counter[Verdict] = Counter()

    def judge(
        self,
        connection_id: str,
        epoch: int,
        seq: int,
        *,
        cursor: Any = None,
        kind: str = "data",
        key: str | None = None,
    ) -> Verdict:
        """The verdict on one record, in stream order; a DELIVER or REPLAY advances the
        connection's seq, a DELIVER of a `data` record with an ordered cursor its cursor."""
        verdict = self._verdict(connection_id, epoch, seq, cursor=cursor, kind=kind, key=key)
        self.counts[verdict] += 1
        return verdict

    def admit(self, record: Mapping[str, Any] | SinkRecord) -> bool:
        """judge() for a sink record, decoded (`{connection_id, epoch, seq, cursor, kind, key, …}`;
        a record without `cursor`/`kind`/`key` is a data record without them) or not. True: hand
        it on (check `kind`: `gap` and `raw` records are delivered too)."""
        if isinstance(record, SinkRecord):
            verdict = self.judge(
                record.connection_id,
                record.epoch,
                record.seq,
                cursor=record.cursor,
                kind=record.kind,
                key=record.key,
            )
        else:
            key = record.get("key")
            verdict = self.judge(
                str(record["connection_id"]),
                int(record["epoch"]),
                int(record["seq"]),
                cursor=record.get("cursor"),
                kind=str(record.get("kind") or "data"),
                key=None if key is None else str(key),
            )
        return verdict is Verdict.DELIVER

    def position(self, connection_id: str) -> Position | None:
        state = self._states.get(connection_id)
        return None if state is None else state.position()

    def positions(self) -> dict[str, Position]:
        """The state to persist with the consumer's checkpoint."""
        return {cid: state.position() for cid, state in self._states.items()}

    def _verdict(
        self, connection_id: str, epoch: int, seq: int, *, cursor: Any, kind: str, key: str | None
    ) -> Verdict:
        state = self._states.get(connection_id)
        if state is None:
            start = seq if self._first_seq is None else self._first_seq
            state = _State(Position(epoch, start - 1))
            self._states[connection_id] = state
        if epoch < state.epoch:
            return Verdict.STALE_EPOCH
        if _numbered_per_epoch(cursor, kind, key):
            state.per_epoch = True
        last = state.seq
        if epoch == state.epoch and state.in_epoch:
            verdict = self._within_epoch(seq, last)
        elif state.per_epoch:
            verdict = Verdict.DELIVER if seq == 0 else Verdict.AHEAD if seq > 0 else Verdict.DUPLICATE
        elif seq in (0, last + 1):
            verdict = Verdict.DELIVER
        else:
            verdict = self._within_epoch(seq, last)
        if verdict is not Verdict.DELIVER:
            # Even a record that is dropped raises the epoch: nothing below it may be delivered now.
            state.in_epoch = state.in_epoch and epoch == state.epoch
            state.epoch = epoch
            return verdict
        if kind == "data" and is_ordered(cursor):
            last_cursor = state.cursor if key is None else state.key_cursors.get(key)
            if at_or_below(cursor, last_cursor):
                verdict = Verdict.REPLAY
            elif key is None:
                state.cursor = cursor
            else:
                state.key_cursors[key] = cursor
        state.epoch, state.seq, state.in_epoch = epoch, seq, True
        return verdict

    @staticmethod
    def _within_epoch(seq: int, last: int) -> Verdict:
        if seq <= last:
            return Verdict.DUPLICATE
        if seq > last + 1:
            return Verdict.AHEAD
        return Verdict.DELIVER
