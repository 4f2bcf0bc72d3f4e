"""What a decoded frame becomes once a socket is ready: classify, split, unwrap, then each record
judged by the socket's positions (positions.py) and its recent `dedup_id` values.

`Records.process` returns the frame's actions; a Reconnect or a Fail among them is always the
last one, and means the socket is over (the caller stops feeding it). It never raises.
"""

from __future__ import annotations

import json
from typing import Any, Final

from leaseworker.protocol.adapter import Action, Dropped, Emit, Fail, Gap, Reconnect, SocketContext
from leaseworker.protocol.generic.decode import Undecodable, raw, snippet
from leaseworker.protocol.generic.model import ClassifyRule, GenericConfig
from leaseworker.protocol.generic.pointers import MISSING, matches
from leaseworker.protocol.generic.positions import REPLAY, Hole, Positions, cursor_value, key_value

DEDUP_IDS: Final = 10_000  # recent `dedup_id` values a socket remembers


def one_line(text: str, limit: int = 200) -> str:
    return " ".join(text.split())[:limit]


def compact(value: Any) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        return repr(value)[:1024]


def classify(config: GenericConfig, decoded: Any) -> ClassifyRule | None:
    """The first rule whose `when` holds for the frame as received (None: data)."""
    for rule in config.frames.classify:
        if matches(decoded, rule.when):
            return rule
    return None


class Records:
    __slots__ = ("_config", "_dedup", "_marker", "_positions")  # one per socket: no __dict__

    def __init__(self, config: GenericConfig, context: SocketContext) -> None:
        self._config = config
        self._positions = Positions(config.cursor, config.gaps, context.resume)
        self._dedup: dict[str, None] = {}  # insertion-ordered: the oldest id is the first
        # A feed that cannot replay marks every socket's start (docs/design.md §4.3), held until the
        # socket's first record so that it bounds the hole on both sides.
        self._marker: Gap | None = None
        if not config.cursor.replayable:
            resume = context.resume
            self._marker = Gap(reason=resume.reason, since_ms=resume.at_ms, from_cursor=resume.cursor)

    def process(self, decoded: Any, wall_ms: int) -> list[Action]:
        frames = self._config.frames
        if isinstance(decoded, Undecodable):
            if frames.on_undecodable == "fail":
                return [Fail(one_line(f"undecodable frame: {decoded.error}", 400))]
            return self._raw(decoded, wall_ms)
        rule = classify(self._config, decoded)
        if rule is not None and rule.action != "data":
            return self._verdict(rule, decoded, wall_ms)
        if frames.split is None:  # one record per frame: the common case
            return self._record(decoded, wall_ms)
        records: Any = frames.split.resolve(decoded)
        if not isinstance(records, list):
            error = f"frames.split {frames.split.text!r} is not an array"
            return self._raw(raw(compact(decoded), error), wall_ms)
        actions: list[Action] = []
        for record in records:
            actions.extend(self._record(record, wall_ms))
            if actions and isinstance(actions[-1], Reconnect | Fail):
                break
        return actions

    def _verdict(self, rule: ClassifyRule, decoded: Any, wall_ms: int) -> list[Action]:
        if rule.action == "heartbeat":
            return self._heartbeat(decoded, rule, wall_ms)
        if rule.action == "error":
            found = MISSING if rule.message is None else rule.message.resolve(decoded)
            message = found if isinstance(found, str) else snippet(decoded if found is MISSING else found)
            return [Reconnect(one_line(f"upstream error: {message}"), kind=rule.refusal)]
        if rule.action == "reconnect":
            return [Reconnect(one_line(f"upstream asked to reconnect: {snippet(decoded)}"), "closed")]
        return []  # ignore

    def _heartbeat(self, decoded: Any, rule: ClassifyRule, wall_ms: int) -> list[Action]:
        # A replaying feed's heartbeats report live positions ahead of the replay: no use.
        if rule.cursor is None or self._config.cursor.replayable:
            return []
        key_pointer = self._config.cursor.key
        key = None if key_pointer is None else key_value(key_pointer.resolve(decoded))
        hole = self._positions.heartbeat(key, rule.cursor.resolve(decoded), wall_ms)
        if hole is None or self._marker is not None:
            return []
        return [Gap("seq_gap", hole.since_ms, wall_ms, hole.from_cursor, hole.to_cursor, key)]

    def _record(self, record: Any, wall_ms: int) -> list[Action]:
        config = self._config
        data = record
        if config.frames.unwrap is not None:
            data = config.frames.unwrap.resolve(record)
            if data is MISSING:
                error = f"frames.unwrap {config.frames.unwrap.text!r} points at nothing"
                return self._raw(raw(compact(record), error), wall_ms)
        cursor_conf, gaps = config.cursor, config.gaps
        cursor = None if cursor_conf.path is None else cursor_value(cursor_conf.path.resolve(data))
        key = None if cursor_conf.key is None else key_value(cursor_conf.key.resolve(data))
        first = None if gaps is None else gaps.first.resolve(data)
        last = None if gaps is None else gaps.last.resolve(data)
        verdict = self._positions.judge(cursor, key, first, last)
        if verdict == REPLAY:
            return [Dropped("replay")]
        dedup = None
        if config.dedup_id is not None:
            found = config.dedup_id.resolve(data)
            dedup = None if found is MISSING else compact(found)
            if dedup is not None and dedup in self._dedup:
                return [Dropped("duplicate")]
        actions: list[Action] = []
        if isinstance(verdict, Hole):
            if verdict.reason == "seq_gap" and cursor_conf.replayable:
                # The next socket resumes from the checkpoint: nothing is lost, nothing marked.
                for_key = "" if key is None else f" for key {key}"
                reason = f"gap: expected {verdict.expected}, got {verdict.to_cursor}{for_key}"
                return [Reconnect(one_line(reason), "protocol")]
            if self._marker is None:  # else the socket's marker already covers this hole
                gap = Gap(
                    verdict.reason, verdict.since_ms, wall_ms, verdict.from_cursor, verdict.to_cursor, key
                )
                actions.append(gap)
        self._positions.accept(cursor, key, last, wall_ms)
        if dedup is not None:
            self._dedup[dedup] = None
            if len(self._dedup) > DEDUP_IDS:
                del self._dedup[next(iter(self._dedup))]
        emit = Emit(data, cursor, key, "data", self._positions.checkpoint())
        if self._marker is None and not actions:
            return [emit]
        return [*self._flush_marker(cursor, wall_ms), *actions, emit]

    def _raw(self, undecodable: Undecodable, wall_ms: int) -> list[Action]:
        emit = Emit(undecodable.data(), None, None, "raw", self._positions.checkpoint())
        return [*self._flush_marker(None, wall_ms), emit]

    def _flush_marker(self, cursor: Any, wall_ms: int) -> list[Action]:
        marker, self._marker = self._marker, None
        if marker is None:
            return []
        return [Gap(marker.reason, marker.since_ms, wall_ms, marker.from_cursor, cursor, None)]
