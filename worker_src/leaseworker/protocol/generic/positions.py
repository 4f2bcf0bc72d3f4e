"""Where a socket stands in its feed: per key (or one key, None), the last cursor and range end,
and what a new record means against them (a replay, a hole, or the next one).

A socket starts from `Resume.cursor` (for a keyed feed the `{key: cursor}` map). A record whose
cursor is at or below the last one is an overlapping replay (strict and monotonic orders), as is
a range whose last is at or below the previous last. A hole is a strict cursor that is not the
previous + 1, or a range whose first is past the previous last + 1 (an overlap is accepted, as
Binance's first depth event after a snapshot overlaps it). Which hole it is depends on where the
previous position came from:
- from this socket: `seq_gap`;
- from the resume cursor, on a feed that replays: `cursor_too_old` (the upstream no longer
  holds what follows our cursor; reconnecting would not help);
- from the resume cursor, on a feed that cannot replay: no hole of its own, as the socket's
  connect marker (docs/design.md §4.3) already covers it.
Cursors compare as numbers when both are numbers, otherwise as strings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final, Literal

from leaseworker.protocol.adapter import Resume
from leaseworker.protocol.generic.model import CursorConfig, GapsConfig

REPLAY: Final = "replay"


def is_int(value: object) -> bool:
    return type(value) is int or (isinstance(value, int) and not isinstance(value, bool))


def _is_number(value: object) -> bool:
    return is_int(value) or (isinstance(value, float) and math.isfinite(value))


def cursor_value(value: Any) -> Any:
    """A usable cursor: a string or a finite number; anything else is no cursor (None)."""
    if type(value) is int or type(value) is str:
        return value
    return value if isinstance(value, str) or _is_number(value) else None


def key_value(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    return str(value) if is_int(value) else None


def compare(left: Any, right: Any) -> int:
    if type(left) is int and type(right) is int:
        return (left > right) - (left < right)
    if _is_number(left) and _is_number(right):
        bigger: bool = left > right
        smaller: bool = left < right
        return int(bigger) - int(smaller)
    a, b = str(left), str(right)
    return (a > b) - (a < b)


@dataclass(slots=True)
class KeyState:
    last: Any = None  # the last record's cursor on this socket, else the resume cursor
    last_ms: int | None = None  # when the last record came (the resume's at_ms before any)
    range_last: Any = None  # the last record's `gaps.last`, else the resume cursor
    live: bool = False  # this socket delivered a record (or learnt a position) for this key


@dataclass(frozen=True, slots=True)
class Hole:
    reason: Literal["seq_gap", "cursor_too_old"]
    from_cursor: Any
    to_cursor: Any
    expected: int
    since_ms: int | None


class Positions:
    __slots__ = ("_at_ms", "_cursor", "_gaps", "_resume_map", "_resume_one", "_states", "keyed")

    def __init__(self, cursor: CursorConfig, gaps: GapsConfig | None, resume: Resume) -> None:
        self._cursor = cursor
        self._gaps = gaps
        self._at_ms = resume.at_ms
        self.keyed = cursor.key is not None
        self._resume_map: dict[str, Any] = {}
        self._resume_one: Any = None
        if self.keyed and isinstance(resume.cursor, dict):
            self._resume_map = {
                str(key): cursor_value(value)
                for key, value in resume.cursor.items()
                if cursor_value(value) is not None
            }
        elif not self.keyed:
            self._resume_one = cursor_value(resume.cursor)
        self._states: dict[str | None, KeyState] = {}

    def state(self, key: str | None) -> KeyState:
        found = self._states.get(key)
        if found is None:
            start = self._resume_map.get(key) if key is not None else self._resume_one
            found = KeyState(last=start, last_ms=self._at_ms if start is not None else None, range_last=start)
            self._states[key] = found
        return found

    def judge(self, cursor: Any, key: str | None, first: Any, last: Any) -> str | Hole | None:
        """REPLAY, a Hole before this record, or None (the next one)."""
        state = self._states.get(key)
        if state is None:
            state = self.state(key)
        order = self._cursor.order
        previous = state.last
        if order != "none" and cursor is not None and previous is not None:
            if type(cursor) is int and type(previous) is int:
                if cursor <= previous:
                    return REPLAY
            elif compare(cursor, previous) <= 0:
                return REPLAY
        if last is not None and is_int(last) and is_int(state.range_last) and last <= state.range_last:
            return REPLAY
        hole: Hole | None = None
        if order == "strict" and is_int(cursor) and is_int(previous) and cursor != previous + 1:
            hole = Hole("seq_gap", previous, cursor, previous + 1, state.last_ms)
        elif first is not None and is_int(first):
            range_last = state.range_last
            if is_int(range_last) and first > range_last + 1:
                hole = Hole("seq_gap", range_last, first, range_last + 1, state.last_ms)
        if hole is None or state.live:
            return hole
        if self._cursor.replayable:
            return Hole("cursor_too_old", hole.from_cursor, hole.to_cursor, hole.expected, hole.since_ms)
        return None

    def accept(self, cursor: Any, key: str | None, last: Any, wall_ms: int) -> None:
        state = self._states.get(key)
        if state is None:
            state = self.state(key)
        if cursor is not None:
            state.last = cursor
        if last is not None and is_int(last):
            state.range_last = last
        state.last_ms = wall_ms
        state.live = True

    def heartbeat(self, key: str | None, position: Any, wall_ms: int) -> Hole | None:
        """A heartbeat reports the upstream's position for a key (Coinbase `last_trade_id`) on a
        feed that cannot replay: past our last record on this socket, records were lost. Either
        way the position becomes the base the next record is checked against."""
        if not is_int(position) or self._cursor.order != "strict":
            return None
        state = self.state(key)
        hole = None
        if state.live and is_int(state.last) and position > state.last:
            hole = Hole("seq_gap", state.last, position, state.last + 1, state.last_ms)
        if not is_int(state.last) or position > state.last:
            state.last = position
            state.last_ms = wall_ms
        state.live = True
        return hole

    def checkpoint(self) -> Any:
        """The connection-level cursor: the `{key: cursor}` map for a keyed feed."""
        if not self.keyed:
            state = self._states.get(None)
            return (state or self.state(None)).last
        merged = dict(self._resume_map)
        for key, state in self._states.items():
            if key is not None and state.last is not None:
                merged[key] = state.last
        return merged
