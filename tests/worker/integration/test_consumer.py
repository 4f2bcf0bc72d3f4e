"""The consumer filter and the shard-order reader (docs/design.md §5), and S1 in arrival order (§2c)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aioboto3
import pytest
from types_aiobotocore_kinesis import KinesisClient

from leaseworker.consumer import ConnectionFilter, Position, Verdict
from leaseworker.records import SinkRecord
from leaseworker.sinks.factory import kinesis_client_config
from leaseworker.sinks.kinesis import KinesisSink
from leaseworker.stream_reader import read_stream, shard_order
from leaseworker_dev.local.invariants import (
    Delivered,
    Report,
    check_arrivals,
    check_s1,
    check_s1_arrival,
    read_sink,
    read_sink_arrivals,
)
from leaseworker_dev.local.stream import read_arrivals

REGION = "us-east-1"
D, DUP, STALE, AHEAD = Verdict.DELIVER, Verdict.DUPLICATE, Verdict.STALE_EPOCH, Verdict.AHEAD


def judge_all(stream: list[tuple[str, int, int]], **kwargs: Any) -> tuple[list[Verdict], ConnectionFilter]:
    filt = ConnectionFilter(**kwargs)
    return [filt.judge(cid, epoch, seq) for cid, epoch, seq in stream], filt


def test_a_takeover_replay_is_delivered_once() -> None:
    # epoch 1 delivers 0..4; the checkpoint was at 2, so epoch 2 replays 3, 4 and goes on.
    stream = [("c", 1, s) for s in range(5)] + [("c", 2, s) for s in range(3, 7)]
    verdicts, filt = judge_all(stream)
    assert verdicts == [D] * 5 + [DUP, DUP, D, D]
    assert filt.position("c") == Position(2, 6)


def test_a_deposed_owners_late_write_is_dropped_by_its_epoch() -> None:
    # epoch 2 took over at 3; a write of epoch 1 (seq 3, 4 and new 5) lands afterwards.
    stream = [("c", 1, 0), ("c", 1, 1), ("c", 1, 2), ("c", 2, 3), ("c", 1, 3), ("c", 1, 5), ("c", 2, 4)]
    verdicts, _ = judge_all(stream)
    assert verdicts == [D, D, D, D, STALE, STALE, D]


def test_even_a_dropped_record_raises_the_epoch() -> None:
    # A replayed duplicate of epoch 2 is the first sign of the takeover; epoch 1's seq 3 after it
    # comes from a deposed owner.
    verdicts, filt = judge_all([("c", 1, 0), ("c", 1, 1), ("c", 2, 1), ("c", 1, 2), ("c", 2, 2)])
    assert verdicts == [D, D, DUP, STALE, D]
    assert filt.counts == {D: 3, DUP: 1, STALE: 1}


def test_a_go_back_n_resend_is_read_complete_and_in_order() -> None:
    # PutRecords accepted 4, 5 while 3 failed; the sink resent 3, 4, 5 (leaseworker.sinks.kinesis).
    stream = [("c", 1, s) for s in (0, 1, 2, 4, 5, 3, 4, 5, 6)]
    verdicts, filt = judge_all(stream)
    assert verdicts == [D, D, D, AHEAD, AHEAD, D, D, D, D]
    assert filt.position("c") == Position(1, 6)


def test_connections_are_independent_and_the_first_seq_is_configurable() -> None:
    stream = [("a", 1, 0), ("b", 7, 1), ("b", 7, 0), ("a", 1, 1)]
    verdicts, _ = judge_all(stream)
    assert verdicts == [D, AHEAD, D, D]
    verdicts, filt = judge_all([("b", 7, 40), ("b", 7, 41), ("b", 7, 40)], first_seq=None)
    assert verdicts == [D, D, DUP]
    restored = ConnectionFilter(filt.positions())
    assert [restored.judge("b", 7, 41), restored.judge("b", 8, 42), restored.judge("b", 7, 43)] == [
        DUP,
        D,
        STALE,
    ]


def test_admit_reads_a_decoded_sink_record() -> None:
    filt = ConnectionFilter()
    records = [SinkRecord("c", seq, 1, "w", 0, None) for seq in (0, 1, 1, 2)]
    assert [filt.admit(json.loads(r.to_json())) for r in records] == [True, True, False, True]


# -- filter v2: every verdict, table-driven ---------------------------------------------------

REPLAY = Verdict.REPLAY


@dataclass(frozen=True)
class R:
    """One record as the filter sees it (connection "c" unless told)."""

    epoch: int
    seq: int
    cursor: Any = None
    kind: str = "data"
    key: str | None = None
    cid: str = "c"


def gap(epoch: int, seq: int, key: str | None = None) -> R:
    return R(epoch, seq, kind="gap", key=key)


def judge_records(records: list[R], **kwargs: Any) -> tuple[list[Verdict], ConnectionFilter]:
    filt = ConnectionFilter(**kwargs)
    verdicts = [filt.judge(r.cid, r.epoch, r.seq, cursor=r.cursor, kind=r.kind, key=r.key) for r in records]
    return verdicts, filt


def cursors(epoch: int, seqs: range, first: int, step: int = 1) -> list[R]:
    return [R(epoch, seq, first + step * n) for n, seq in enumerate(seqs)]


VERDICT_CASES: dict[str, tuple[list[R], list[Verdict]]] = {
    # STALE_EPOCH
    "a lower epoch after a higher one is stale": (
        [R(2, 0), R(1, 1), R(1, 0), R(2, 1)],
        [D, STALE, STALE, D],
    ),
    "a stale record moves nothing, not even a cursor": (
        [R(2, 0, 10), R(1, 1, 50), R(2, 1, 11)],
        [D, STALE, D],
    ),
    "a dropped record of a new epoch raises the epoch (generic)": (
        [R(1, 0, 10), R(2, 1, 12), R(1, 1, 11), R(2, 0, 10), R(2, 1, 12)],
        [D, AHEAD, STALE, REPLAY, D],
    ),
    # DUPLICATE and AHEAD within an epoch
    "a resent seq within an epoch is a duplicate": (
        [R(1, 0), R(1, 1), R(1, 1), R(1, 0), R(1, 2)],
        [D, D, DUP, DUP, D],
    ),
    "a seq past the next one is ahead until the missing one comes": (
        [R(1, 0), R(1, 2), R(1, 3), R(1, 1), R(1, 2), R(1, 3)],
        [D, AHEAD, AHEAD, D, D, D],
    ),
    "a generic resend is a duplicate by seq, before any cursor is looked at": (
        [R(1, 0, 10), R(1, 1, 11), R(1, 0, 10), R(1, 1, 11), R(1, 2, 12)],
        [D, D, DUP, DUP, D],
    ),
    # a new epoch: seqfeed/1 (no cursor, key or marker: seqs continue across epochs)
    "seqfeed: a takeover replays from the checkpoint, duplicates by seq": (
        [R(1, s) for s in range(5)] + [R(2, s) for s in range(2, 7)],
        [D] * 5 + [DUP, DUP, DUP, D, D],
    ),
    "seqfeed: a takeover that resumes exactly after the last delivered": (
        [R(1, 0), R(1, 1), R(2, 2), R(2, 3)],
        [D, D, D, D],
    ),
    "seqfeed: a new epoch's seq past last + 1 is ahead": (
        [R(1, 0), R(1, 1), R(2, 4), R(2, 2), R(2, 3), R(2, 4)],
        [D, D, AHEAD, D, D, D],
    ),
    "seqfeed: a takeover without any checkpoint replays from 0, delivered again": (
        [R(1, 0), R(1, 1), R(2, 0), R(2, 1), R(2, 2)],
        [D, D, D, D, D],
    ),
    # a new epoch: generic/1 (numbered from 0 in each epoch)
    "generic: a takeover marker at seq 0 starts the new epoch": (
        [gap(1, 0), R(1, 1, 10), R(1, 2, 11), gap(2, 0), R(2, 1, 12)],
        [D, D, D, D, D],
    ),
    "generic: a replay from the checkpoint cursor is dropped as replay": (
        cursors(1, range(4), 100) + cursors(2, range(4), 101),
        [D] * 4 + [REPLAY, REPLAY, REPLAY, D],
    ),
    "generic: a non-contiguous cursor (Jetstream time_us), inclusive resume": (
        [R(1, 0, 1_000), R(1, 1, 1_500), R(1, 2, 1_700), R(2, 0, 1_500), R(2, 1, 1_700), R(2, 2, 2_100)],
        [D, D, D, REPLAY, REPLAY, D],
    ),
    "generic: a new epoch's seq 0 failed and is resent: the later seqs are ahead": (
        [R(1, 0, 10), R(1, 1, 11), R(2, 2, 13), R(2, 0, 11), R(2, 1, 12), R(2, 2, 13)],
        [D, D, AHEAD, REPLAY, D, D],
    ),
    "generic: a known per-epoch connection expects 0 even from a cursorless record": (
        [R(1, 0, 10), R(1, 1, 11), R(1, 2), R(2, 3), R(2, 0), R(2, 1)],
        [D, D, D, AHEAD, D, D],
    ),
    "generic without cursor or marker: a new epoch from 0 is delivered, not dropped": (
        [R(1, s) for s in range(4)] + [R(2, s) for s in range(4)],
        [D] * 8,
    ),
    "generic without cursor: a new epoch's resend of seq 0 after a later seq": (
        [R(1, s) for s in range(4)] + [R(2, 2), R(2, 0), R(2, 1), R(2, 2)],
        [D] * 4 + [DUP, D, D, D],
    ),
    # REPLAY
    "a cursor at the last delivered one is a replay": (
        [R(1, 0, 5), R(1, 1, 5), R(1, 2, 6)],
        [D, REPLAY, D],
    ),
    "a replay consumes its seq: the next seq follows it, its resend is a duplicate": (
        [R(1, 0, 5), R(1, 1, 4), R(1, 1, 4), R(1, 3, 7), R(1, 2, 6)],
        [D, REPLAY, DUP, AHEAD, D],
    ),
    "a replay does not move the cursor back": (
        [R(1, 0, 10), R(1, 1, 3), R(1, 2, 9), R(1, 3, 11)],
        [D, REPLAY, REPLAY, D],
    ),
    "a data record without a cursor is delivered and leaves the cursor": (
        [R(1, 0, 10), R(1, 1), R(1, 2, 10), R(1, 3, 12)],
        [D, D, REPLAY, D],
    ),
    "cursors are kept per key": (
        [
            R(1, 0, 5, key="BTC"),
            R(1, 1, 3, key="ETH"),
            R(1, 2, 4, key="ETH"),
            R(1, 3, 5, key="BTC"),
            R(1, 4, 4, key="ETH"),
            R(1, 5, 6, key="BTC"),
            R(1, 6, 5),  # no key: the connection's own cursor, none yet
        ],
        [D, D, D, REPLAY, REPLAY, D, D],
    ),
    "keyed cursors survive a takeover": (
        [
            R(1, 0, 7, key="a"),
            R(1, 1, 9, key="b"),
            R(2, 0, 7, key="a"),
            R(2, 1, 8, key="b"),
            R(2, 2, 8, key="a"),
        ],
        [D, D, REPLAY, REPLAY, D],
    ),
    "numbers compare as numbers, int and float alike": (
        [R(1, 0, 10), R(1, 1, 9.5), R(1, 2, 10.0), R(1, 3, 10.25), R(1, 4, 100)],
        [D, REPLAY, REPLAY, D, D],
    ),
    "strings compare as strings": (
        [R(1, 0, "0009"), R(1, 1, "0010"), R(1, 2, "001"), R(1, 3, "0010"), R(1, 4, "b"), R(1, 5, "a")],
        [D, D, REPLAY, REPLAY, D, REPLAY],
    ),
    "cursors of mixed types are not comparable: never a replay": (
        # each delivered ordered cursor becomes the last one, whatever its type
        [R(1, 0, 10), R(1, 1, "5"), R(1, 2, "4"), R(1, 3, 5), R(1, 4, 4)],
        [D, D, REPLAY, D, REPLAY],
    ),
    "non-scalar, bool and NaN cursors are not ordered: delivered, the cursor stays": (
        [
            R(1, 0, 10),
            R(1, 1, [1, 2]),
            R(1, 2, {"t": 1}),
            R(1, 3, True),
            R(1, 4, float("nan")),
            R(1, 5, 10),
        ],
        [D, D, D, D, D, REPLAY],
    ),
    # gap and raw records
    "gap markers are delivered by seq and never move or match a cursor": (
        [R(1, 0, 10), gap(1, 1), gap(1, 1), R(1, 2, 9), R(1, 4, 11), gap(1, 3), R(1, 4, 11)],
        [D, D, DUP, REPLAY, AHEAD, D, D],
    ),
    "a gap record carrying a cursor is still only judged by seq": (
        [
            R(1, 0, 10),
            R(1, 1, 5, kind="gap"),
            R(1, 2, 10),
            R(1, 3, 6, kind="gap", key="k"),
            R(1, 4, 6, key="k"),
        ],
        [D, D, REPLAY, D, D],
    ),
    "raw records are delivered by seq, with no cursor": (
        [R(1, 0, 10), R(1, 1, kind="raw"), R(1, 1, kind="raw"), R(1, 2, 3, kind="raw"), R(1, 3, 11)],
        [D, D, DUP, D, D],
    ),
    "connections are independent": (
        [R(1, 0, 10, cid="a"), R(1, 0, 10, cid="b"), R(2, 0, 10, cid="a"), R(1, 1, 11, cid="b")],
        [D, D, REPLAY, D],
    ),
}


@pytest.mark.parametrize(("records", "expected"), VERDICT_CASES.values(), ids=VERDICT_CASES.keys())
def test_verdicts(records: list[R], expected: list[Verdict]) -> None:
    verdicts, filt = judge_records(records)
    assert verdicts == expected
    assert filt.counts == Counter(expected)


def test_every_verdict_has_a_case() -> None:
    assert {v for _, expected in VERDICT_CASES.values() for v in expected} == set(Verdict)


def test_the_position_holds_epoch_seq_and_cursors() -> None:
    _, filt = judge_records([R(1, 0, 10), R(1, 1, 3, key="k")])
    assert filt.position("c") == Position(1, 1, 10, {"k": 3}, in_epoch=True, per_epoch=True)
    # A new epoch's dropped record raises the epoch but delivers nothing in it; a stale one moves nothing.
    filt.judge("c", 2, 2, cursor=12)
    filt.judge("c", 1, 2, cursor=99)
    assert filt.positions() == {"c": Position(2, 1, 10, {"k": 3}, in_epoch=False, per_epoch=True)}
    assert filt.position("other") is None


def test_positions_round_trip_through_json_and_restart_the_filter() -> None:
    stream = [gap(1, 0), R(1, 1, 100), R(1, 2, 7, key="x"), R(1, 3, 101)]
    _, filt = judge_records(stream)
    saved = json.dumps({cid: p.to_dict() for cid, p in filt.positions().items()})
    restored = ConnectionFilter({cid: Position.from_dict(p) for cid, p in json.loads(saved).items()})
    assert restored.positions() == filt.positions()
    # The new owner's epoch replays from the checkpoint: every replayed message is recognised.
    replay = [R(2, 0, 100), R(2, 1, 7, key="x"), R(2, 2, 101), R(2, 3, 8, key="x"), R(2, 4, 102)]
    assert [restored.judge("c", r.epoch, r.seq, cursor=r.cursor, key=r.key) for r in replay] == [
        REPLAY,
        REPLAY,
        REPLAY,
        D,
        D,
    ]


def test_a_half_started_epoch_survives_a_restart() -> None:
    # A cursorless generic connection: epoch 2's seq 2 came before its seq 0 (go-back-N).
    _, filt = judge_records([R(1, 0), R(1, 1), R(1, 2), R(2, 2)])
    saved = {
        cid: Position.from_dict(json.loads(json.dumps(p.to_dict()))) for cid, p in filt.positions().items()
    }
    assert saved == {"c": Position(2, 2, in_epoch=False)}
    restored = ConnectionFilter(saved)
    assert [restored.judge("c", 2, s) for s in (0, 1, 2, 3)] == [D, D, D, D]


def test_a_v1_position_reads_as_before() -> None:
    assert Position.from_dict({"epoch": 3, "seq": 41}) == Position(3, 41)
    assert Position(3, 41).to_dict() == {"epoch": 3, "seq": 41}
    restored = ConnectionFilter({"c": Position.from_dict({"epoch": 3, "seq": 41})})
    assert [restored.judge("c", 3, 41), restored.judge("c", 3, 42), restored.judge("c", 4, 40)] == [
        DUP,
        D,
        DUP,
    ]


def test_a_connection_the_filter_joins_late_takes_its_first_record_whole() -> None:
    verdicts, filt = judge_records([R(4, 17, 900), R(4, 18, 901), R(5, 0, 901), R(5, 1, 902)], first_seq=None)
    assert verdicts == [D, D, REPLAY, D]
    assert filt.position("c") == Position(5, 1, 902, per_epoch=True)


def test_admit_reads_records_of_every_kind() -> None:
    records = [
        SinkRecord("c", 0, 1, "w1", 0, {"reason": "connect"}, kind="gap"),
        SinkRecord("c", 1, 1, "w1", 0, {"t": 1}, cursor=1_000),
        SinkRecord("c", 2, 1, "w1", 0, "\x00", kind="raw"),
        SinkRecord("c", 3, 1, "w1", 0, {"p": 1}, cursor=5, key="BTC"),
        SinkRecord("c", 0, 2, "w2", 0, {"reason": "takeover"}, kind="gap"),
        SinkRecord("c", 1, 2, "w2", 0, {"t": 1}, cursor=1_000),
        SinkRecord("c", 2, 2, "w2", 0, {"p": 1}, cursor=5, key="BTC"),
        SinkRecord("c", 3, 2, "w2", 0, {"p": 2}, cursor=6, key="BTC"),
    ]
    expected = [True, True, True, True, True, False, False, True]
    as_dicts = ConnectionFilter()
    assert [as_dicts.admit(json.loads(r.to_json())) for r in records] == expected
    as_objects = ConnectionFilter()
    assert [as_objects.admit(r) for r in records] == expected
    assert as_dicts.counts == as_objects.counts == Counter({D: 6, REPLAY: 2})


def test_shard_order_puts_parents_first() -> None:
    shards: list[Any] = [
        {"ShardId": "shardId-3", "ParentShardId": "shardId-1", "AdjacentParentShardId": "shardId-2"},
        {"ShardId": "shardId-1", "ParentShardId": "shardId-0"},
        {"ShardId": "shardId-2", "ParentShardId": "shardId-0"},
        {"ShardId": "shardId-0"},
        {"ShardId": "shardId-4", "ParentShardId": "shardId-gone"},  # parent past retention
    ]
    assert shard_order(shards) == ["shardId-0", "shardId-1", "shardId-2", "shardId-3", "shardId-4"]


# -- S1 in arrival order ------------------------------------------------------------------------


def item(epoch: int, seq: int, received_at_ms: int, cid: str = "c") -> Delivered:
    return Delivered(cid, seq, epoch, f"w{epoch}", received_at_ms)


def test_s1_in_arrival_order_sees_a_late_write_that_receipt_times_hide() -> None:
    # The late write of epoch 1 arrives last but was received (stamped) before epoch 2 began.
    arrivals = [item(1, 0, 100), item(1, 1, 110), item(2, 0, 200), item(2, 1, 210), item(1, 2, 120)]
    by_receipt = Report()
    check_s1({"c": arrivals}, by_receipt)
    assert by_receipt.ok  # the clock-based check cannot see it
    at_arbiter = Report()
    check_s1_arrival(arrivals, at_arbiter)
    assert len(at_arbiter.violations) == 1
    assert at_arbiter.violations[0].startswith("S1 c: epoch 1 (seq 2, w1) arrived at position 4")


def test_check_arrivals_judges_s1_s2_s3() -> None:
    good = [item(1, 0, 1), item(1, 1, 2), item(2, 1, 3), item(2, 2, 4), item(1, 0, 5, "d")]
    report = check_arrivals(good, [{"c": 1}, {"c": 2}])
    assert report.ok, report.violations
    assert (report.connections, report.delivered, report.duplicates) == (2, 4, 1)
    bad = check_arrivals([item(2, 0, 1), item(1, 2, 2)], [{"c": 2}, {"c": 1}])
    assert [v.split(":")[0] for v in bad.violations] == ["S1 c", "S2 c", "S3 c"]


def test_a_sink_retry_in_the_same_epoch_is_a_counted_duplicate_not_a_violation() -> None:
    # A PutRecords whose reply was lost landed; the worker fetched seqs 1-2 again, same epoch.
    retried = [item(1, 0, 1), item(1, 1, 2), item(1, 2, 3), item(1, 1, 4), item(1, 2, 5), item(1, 3, 6)]
    report = check_arrivals(retried, [{"c": 0}, {"c": 3}])
    assert report.ok, report.violations
    assert (report.delivered, report.duplicates, report.missing) == (4, 2, 0)
    gap = check_arrivals([item(1, 0, 1), item(1, 2, 2), item(1, 2, 3)])
    assert [v.split(":")[0] for v in gap.violations] == ["S2 c"]


def test_file_sink_arrivals_keep_each_files_order(tmp_path: Path) -> None:
    def write(worker: str, rows: list[tuple[int, int, int]]) -> None:
        lines = [SinkRecord("c", seq, epoch, worker, at, None).to_json() for epoch, seq, at in rows]
        (tmp_path / f"{worker}.jsonl").write_text("".join(line + "\n" for line in lines))

    write("w1", [(1, 0, 10), (1, 1, 20), (1, 2, 30)])
    write("w2", [(2, 2, 25), (2, 3, 40)])
    arrivals = read_sink_arrivals(tmp_path)
    assert [(d.epoch, d.seq) for d in arrivals] == [(1, 0), (1, 1), (2, 2), (1, 2), (2, 3)]
    report = Report()
    check_s1_arrival(arrivals, report)
    assert len(report.violations) == 1  # epoch 1's seq 2 was received after epoch 2 began
    assert sorted(arrivals, key=lambda d: (d.epoch, d.seq)) == sorted(
        read_sink(tmp_path)["c"], key=lambda d: (d.epoch, d.seq)
    )


# -- against moto's Kinesis -------------------------------------------------------------------


@pytest.fixture
async def kinesis(moto_endpoint: str) -> AsyncIterator[KinesisClient]:
    async with aioboto3.Session().client(
        "kinesis", endpoint_url=moto_endpoint, region_name=REGION, config=kinesis_client_config()
    ) as client:
        yield client


async def test_the_reader_returns_each_shard_in_order_and_the_filter_cleans_it(
    kinesis: KinesisClient, moto_endpoint: str
) -> None:
    name = "consumer-read"
    await kinesis.create_stream(StreamName=name, ShardCount=3)
    await kinesis.get_waiter("stream_exists").wait(
        StreamName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 20}
    )
    sink = KinesisSink(kinesis, name)
    connections = [f"conn-{n}" for n in range(6)]
    await sink.write(
        [SinkRecord(cid, seq, 1, "w1", seq, {"n": seq}) for seq in range(5) for cid in connections]
    )
    # A takeover: epoch 2 replays from seq 3.
    await sink.write(
        [SinkRecord(cid, seq, 2, "w2", 10 + seq, {"n": seq}) for seq in range(3, 8) for cid in connections]
    )

    entries = [entry async for entry in read_stream(kinesis, name)]
    assert len(entries) == 60
    assert len({entry.shard_id for entry in entries}) > 1  # spread over shards, each read in order
    for cid in connections:
        mine = [e for e in entries if e.partition_key == cid]
        assert len({e.shard_id for e in mine}) == 1
        assert [int(e.sequence_number) for e in mine] == sorted(int(e.sequence_number) for e in mine)
        assert [(e.record["epoch"], e.record["seq"]) for e in mine] == [(1, s) for s in range(5)] + [
            (2, s) for s in range(3, 8)
        ]

    filt = ConnectionFilter()
    kept = [e.record for e in entries if filt.admit(e.record)]
    assert {cid: [r["seq"] for r in kept if r["connection_id"] == cid] for cid in connections} == {
        cid: list(range(8)) for cid in connections
    }
    assert filt.counts[Verdict.DUPLICATE] == 12

    arrivals = await read_arrivals(moto_endpoint, name)
    report = check_arrivals(arrivals)
    assert report.ok, report.violations
    assert report.duplicates == 12


async def test_the_reader_ends_while_a_writer_keeps_writing(
    kinesis: KinesisClient, moto_endpoint: str
) -> None:
    """The system tests read the stream while the fleet still delivers: the read must end at the
    tip it reaches, not chase the records written while it reads. Here a record is written after
    every GetRecords call, so no page is ever empty."""
    name = "consumer-live"
    await kinesis.create_stream(StreamName=name, ShardCount=1)
    await kinesis.get_waiter("stream_exists").wait(
        StreamName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 20}
    )
    async with aioboto3.Session().client(
        "kinesis", endpoint_url=moto_endpoint, region_name=REGION, config=kinesis_client_config()
    ) as writer_client:
        sink = KinesisSink(writer_client, name)
        await sink.write([SinkRecord("c", seq, 1, "w1", seq, {"n": seq}) for seq in range(100)])
        calls = 0

        async def write_one_more(**_: Any) -> None:
            nonlocal calls
            calls += 1
            if calls <= WRITES_AT_MOST:  # bounded, so that a reader that chases still ends
                await sink.write([SinkRecord("c", 99 + calls, 1, "w1", 0, {"n": calls})])

        handler: Any = write_one_more  # aiobotocore awaits a coroutine handler; the stubs say None
        kinesis.meta.events.register("after-call.kinesis.GetRecords", handler)
        try:
            read = [entry async for entry in read_stream(kinesis, name)]
        finally:
            kinesis.meta.events.unregister("after-call.kinesis.GetRecords", handler)
    assert calls < 3, f"{calls} GetRecords calls: the reader chased the writer"
    seqs = [int(entry.record["seq"]) for entry in read]
    assert seqs == list(range(len(seqs))) and len(seqs) >= 100


WRITES_AT_MOST = 50


async def test_a_generic_feeds_takeover_replay_is_read_once_from_the_stream(kinesis: KinesisClient) -> None:
    """Filter v2 end to end: a keyed feed that replays (seq restarts at 0, cursors per key) and a
    feed that cannot (gap markers), both across a takeover, through a real PutRecords/GetRecords."""
    name = "consumer-generic"
    await kinesis.create_stream(StreamName=name, ShardCount=2)
    await kinesis.get_waiter("stream_exists").wait(
        StreamName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 20}
    )
    sink = KinesisSink(kinesis, name)
    trades = [("BTC", 100 + n) if n % 2 else ("ETH", 50 + n) for n in range(8)]  # (key, trade_id)

    def keyed(epoch: int, worker: str, batch: list[tuple[str, int]]) -> list[SinkRecord]:
        return [
            SinkRecord("trades", seq, epoch, worker, 0, {"id": tid}, cursor=tid, key=key)
            for seq, (key, tid) in enumerate(batch)
        ]

    def live(epoch: int, worker: str, values: range, reason: str) -> list[SinkRecord]:
        marker = SinkRecord("live", 0, epoch, worker, 0, {"reason": reason}, kind="gap")
        return [marker] + [
            SinkRecord("live", 1 + n, epoch, worker, 0, {"v": v}) for n, v in enumerate(values)
        ]

    await sink.write(keyed(1, "w1", trades[:6]) + live(1, "w1", range(3), "connect"))
    # The checkpoint held trades[:3]: the new owner replays trades[3:6] under fresh seqs, then goes on.
    await sink.write(keyed(2, "w2", trades[3:]) + live(2, "w2", range(3, 5), "takeover"))

    filt = ConnectionFilter()
    kept = [entry.record async for entry in read_stream(kinesis, name) if filt.admit(entry.record)]
    assert [r["data"]["id"] for r in kept if r["connection_id"] == "trades"] == [tid for _, tid in trades]
    assert [(r["kind"], r["data"]) for r in kept if r["connection_id"] == "live"] == [
        ("gap", {"reason": "connect"}),
        *(("data", {"v": v}) for v in range(3)),
        ("gap", {"reason": "takeover"}),
        *(("data", {"v": v}) for v in range(3, 5)),
    ]
    assert filt.counts == Counter({Verdict.DELIVER: 8 + 7, Verdict.REPLAY: 3})
