"""The consumer filter and the shard-order reader (DESIGN.md §5), and S1 in arrival order (§2c)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aioboto3
import pytest
from types_aiobotocore_kinesis import KinesisClient

from leaseworker.consumer import (
    ConnectionFilter,
    Position,
    Verdict,
    read_stream,
    shard_order,
)
from leaseworker.local.invariants import (
    Delivered,
    Report,
    check_arrivals,
    check_s1,
    check_s1_arrival,
    read_sink,
    read_sink_arrivals,
)
from leaseworker.local.stream import read_arrivals
from leaseworker.records import SinkRecord
from leaseworker.sinks.factory import kinesis_client_config
from leaseworker.sinks.kinesis import KinesisSink

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
