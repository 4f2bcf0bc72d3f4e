"""Sinks (docs/design.md §5): at-least-once, and write() returns only once the batch is durable."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, cast

import aioboto3
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from types_aiobotocore_kinesis import KinesisClient

from leaseworker.records import SinkRecord
from leaseworker.settings import SettingsError
from leaseworker.sinks import Sink, SinkError, open_sink
from leaseworker.sinks.file import FileSink
from leaseworker.sinks.kinesis import (
    MAX_BYTES_PER_CALL,
    MAX_RECORDS_PER_CALL,
    KinesisSink,
    _Entry,
    go_back_n,
    plan_calls,
)
from leaseworker.sinks.null import NullSink
from leaseworker.sinks.stdout import StdoutSink

REGION = "us-east-1"


def record(seq: int, connection_id: str = "c1", data: Any = None, epoch: int = 1) -> SinkRecord:
    return SinkRecord(
        connection_id=connection_id,
        seq=seq,
        epoch=epoch,
        worker_id="w1",
        received_at_ms=1_700_000_000_000 + seq,
        data={"n": seq} if data is None else data,
    )


def no_jitter(low: float, high: float) -> float:
    return 0.0


# -- file ------------------------------------------------------------------------------------


def read_lines(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n"), "the file must end on a whole line"
    return [json.loads(line) for line in text.splitlines()]


async def test_file_sink_writes_whole_parseable_lines(tmp_path: Path) -> None:
    sink = FileSink(tmp_path / "out" / "nested", "w1")
    batch = [record(0), record(1, data={"text": "line\nbreak", "ü": "ß"}), record(2, data=[1, None])]
    await sink.write(batch)
    path = tmp_path / "out" / "nested" / "w1.jsonl"
    assert sink.path == path
    assert path.read_text(encoding="utf-8") == "".join(r.to_json() + "\n" for r in batch)
    assert [line["seq"] for line in read_lines(path)] == [0, 1, 2]
    assert read_lines(path)[1]["data"] == {"text": "line\nbreak", "ü": "ß"}
    await sink.close()


async def test_file_sink_appends_across_writes_and_reopen(tmp_path: Path) -> None:
    sink = FileSink(tmp_path, "w1")
    await sink.write([record(0), record(1)])
    await sink.write([])
    await sink.write([record(2)])
    await sink.close()
    reopened = FileSink(tmp_path, "w1")
    await reopened.write([record(3)])
    await reopened.close()
    assert [line["seq"] for line in read_lines(tmp_path / "w1.jsonl")] == [0, 1, 2, 3]


async def test_file_sink_concurrent_writes_never_interleave(tmp_path: Path) -> None:
    sink = FileSink(tmp_path, "w1")
    payload = "x" * 20_000  # large lines make a torn write likely if it could happen

    async def writer(task: int) -> None:
        for batch in range(10):
            await sink.write([record(batch * 5 + i, f"c{task}", {"p": payload}) for i in range(5)])
            await asyncio.sleep(0)

    async with asyncio.TaskGroup() as group:
        for task in range(40):
            group.create_task(writer(task))
    await sink.close()
    lines = read_lines(tmp_path / "w1.jsonl")
    assert len(lines) == 40 * 10 * 5
    by_connection: dict[str, list[int]] = {}
    for line in lines:
        assert line["data"] == {"p": payload}
        by_connection.setdefault(line["connection_id"], []).append(line["seq"])
    assert by_connection == {f"c{task}": list(range(50)) for task in range(40)}


async def test_file_sink_failed_write_leaves_no_half_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = FileSink(tmp_path, "w1")
    await sink.write([record(0)])
    before = (tmp_path / "w1.jsonl").read_bytes()
    real_write = os.write
    calls = 0

    def half_then_enospc(fd: int, data: Any) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            return real_write(fd, bytes(data)[: len(data) // 2])  # a short write, then …
        raise OSError(errno.ENOSPC, "No space left on device")  # … the disk fills up

    monkeypatch.setattr(os, "write", half_then_enospc)
    with pytest.raises(SinkError, match="No space left"):
        await sink.write([record(1), record(2)])
    monkeypatch.undo()
    assert (tmp_path / "w1.jsonl").read_bytes() == before
    await sink.write([record(1)])
    assert [line["seq"] for line in read_lines(tmp_path / "w1.jsonl")] == [0, 1]
    await sink.close()


async def test_file_sink_short_writes_are_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write

    def seven_bytes_at_a_time(fd: int, data: Any) -> int:
        return real_write(fd, bytes(data)[:7])

    monkeypatch.setattr(os, "write", seven_bytes_at_a_time)
    sink = FileSink(tmp_path, "w1")
    await sink.write([record(0), record(1)])
    await sink.close()
    assert [line["seq"] for line in read_lines(tmp_path / "w1.jsonl")] == [0, 1]


async def test_file_sink_fsync_option_and_closed_sink(tmp_path: Path) -> None:
    sink = FileSink(tmp_path, "w1", fsync=True)
    await sink.write([record(0)])
    await sink.close()
    await sink.close()  # idempotent
    with pytest.raises(SinkError, match="closed"):
        await sink.write([record(1)])
    assert len(read_lines(tmp_path / "w1.jsonl")) == 1


async def test_file_sink_asks_validity_right_before_the_write_syscall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = FileSink(tmp_path, "w1")
    await sink.write([record(0)])
    events: list[str] = []
    real_write = os.write

    def recording_write(fd: int, data: Any) -> int:
        events.append("write")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", recording_write)
    lease = iter([True, False])

    def valid() -> bool:
        events.append("valid")
        return next(lease)

    await sink.write([record(1)], valid=valid)
    assert events == ["valid", "write"]
    events.clear()
    with pytest.raises(SinkError, match="lease no longer valid") as raised:
        await sink.write([record(2)], valid=valid)
    assert raised.value.accepted == 0
    assert events == ["valid"]  # the lease lapsed: no syscall at all
    await sink.close()
    assert [line["seq"] for line in read_lines(tmp_path / "w1.jsonl")] == [0, 1]


@pytest.mark.parametrize("worker_id", ["", "a/b", "../x", "w 1"])
def test_file_sink_rejects_worker_ids_that_are_not_file_names(tmp_path: Path, worker_id: str) -> None:
    with pytest.raises(ValueError, match="worker_id"):
        FileSink(tmp_path, worker_id)


# -- stdout and null -------------------------------------------------------------------------


async def test_stdout_sink_prints_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    sink = StdoutSink()
    await sink.write([record(0), record(1)])
    await sink.close()
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [0, 1]


async def test_stdout_sink_reports_a_closed_stream() -> None:
    stream = io.StringIO()
    sink = StdoutSink(stream)
    await sink.write([record(0)])
    assert stream.getvalue() == record(0).to_json() + "\n"
    stream.close()
    with pytest.raises(SinkError):
        await sink.write([record(1)])
    await sink.close()


async def test_null_sink_counts() -> None:
    sink = NullSink()
    await sink.write([record(0), record(1)])
    await sink.write([record(2)])
    await sink.close()
    assert (sink.records, sink.batches) == (3, 2)


# -- kinesis against moto --------------------------------------------------------------------


@pytest.fixture
async def kinesis(moto_endpoint: str) -> AsyncIterator[KinesisClient]:
    session = aioboto3.Session()
    async with session.client("kinesis", endpoint_url=moto_endpoint, region_name=REGION) as client:
        yield client


async def create_stream(client: KinesisClient, name: str, shards: int = 2) -> None:
    await client.create_stream(StreamName=name, ShardCount=shards)
    waiter = client.get_waiter("stream_exists")
    await waiter.wait(StreamName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 20})


async def read_stream(client: KinesisClient, name: str) -> list[tuple[str, dict[str, Any]]]:
    """Every record in the stream as (partition key, decoded JSON), in shard order per shard."""
    out: list[tuple[str, dict[str, Any]]] = []
    shards = (await client.list_shards(StreamName=name))["Shards"]
    for shard in shards:
        iterator = (
            await client.get_shard_iterator(
                StreamName=name, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
            )
        )["ShardIterator"]
        while iterator:
            response = await client.get_records(ShardIterator=iterator, Limit=10_000)
            out.extend((r["PartitionKey"], json.loads(r["Data"])) for r in response["Records"])
            if not response["Records"]:
                break
            iterator = response.get("NextShardIterator", "")
    return out


async def test_kinesis_sink_round_trip_through_moto(kinesis: KinesisClient) -> None:
    await create_stream(kinesis, "sink-round-trip")
    sink = KinesisSink(kinesis, "sink-round-trip")
    batch = [record(seq, f"conn-{seq % 3}", {"n": seq, "pad": "y" * 100}) for seq in range(1200)]
    await sink.write(batch)
    await sink.close()
    assert sink.calls == 3  # 500 + 500 + 200
    stored = await read_stream(kinesis, "sink-round-trip")
    assert len(stored) == 1200
    per_key: dict[str, list[int]] = {}
    for key, data in stored:
        assert data["connection_id"] == key
        per_key.setdefault(key, []).append(data["seq"])
    for index in range(3):
        assert per_key[f"conn-{index}"] == list(range(index, 1200, 3))  # complete and in order
    with pytest.raises(SinkError, match="closed"):
        await sink.write(batch[:1])


async def test_kinesis_sink_missing_stream_fails_fast(kinesis: KinesisClient) -> None:
    sink = KinesisSink(kinesis, "no-such-stream", deadline_seconds=5)
    started = time.monotonic()
    with pytest.raises(SinkError, match="ResourceNotFound"):
        await sink.write([record(0)])
    assert time.monotonic() - started < 2


# -- kinesis with a hand-written fake --------------------------------------------------------


Behaviour = Callable[[int, list[dict[str, Any]]], list[str | None] | Exception]


class FakeKinesis:
    """Just enough of PutRecords to script what moto cannot produce: partial failures
    (FailedRecordCount > 0 with per-record ErrorCode), throttling and outages.

    `behaviour(call_index, records)` returns one error code (or None) per record, or an exception
    to raise for the whole call. Accepted records are appended to `stream`, in request order.
    """

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.calls: list[list[dict[str, Any]]] = []
        self.stream: list[tuple[str, dict[str, Any]]] = []

    async def put_records(self, *, Records: list[dict[str, Any]], StreamName: str) -> dict[str, Any]:
        index = len(self.calls)
        self.calls.append(Records)
        outcome = self.behaviour(index, Records)
        if isinstance(outcome, Exception):
            raise outcome
        results: list[dict[str, Any]] = []
        for entry, error in zip(Records, outcome, strict=True):
            if error is None:
                self.stream.append((entry["PartitionKey"], json.loads(entry["Data"])))
                results.append({"SequenceNumber": str(len(self.stream)), "ShardId": "shardId-0"})
            else:
                results.append({"ErrorCode": error, "ErrorMessage": "scripted"})
        return {"FailedRecordCount": sum(e is not None for e in outcome), "Records": results}


def fake_sink(fake: FakeKinesis, deadline_seconds: float = 5.0) -> KinesisSink:
    return KinesisSink(
        cast(KinesisClient, fake), "fake", deadline_seconds=deadline_seconds, random_uniform=no_jitter
    )


def throttle(code: str = "ProvisionedThroughputExceededException") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "scripted"}}, "PutRecords")


def next_expected_filter(stream: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, list[int]]:
    """What a consumer keeping the next expected seq per connection reads."""
    accepted: dict[str, list[int]] = {}
    for key, data in stream:
        seqs = accepted.setdefault(key, [])
        if data["seq"] == (seqs[-1] + 1 if seqs else 0):
            seqs.append(data["seq"])
    return accepted


async def test_partial_failure_resends_failed_records_and_their_successors() -> None:
    def first_call_fails_some(index: int, records: list[dict[str, Any]]) -> list[str | None]:
        if index > 0:
            return [None] * len(records)
        failing = {("a", 2), ("b", 0), ("b", 3)}
        return [
            "ProvisionedThroughputExceededException"
            if (r["PartitionKey"], json.loads(r["Data"])["seq"]) in failing
            else None
            for r in records
        ]

    fake = FakeKinesis(first_call_fails_some)
    sink = fake_sink(fake)
    batch = [record(seq, key) for seq in range(6) for key in ("a", "b", "c")]
    await sink.write(batch)

    assert len(fake.calls) == 2
    resent = [(r["PartitionKey"], json.loads(r["Data"])["seq"]) for r in fake.calls[1]]
    # Go-back-N per connection: a from 2, b from 0; c had no failure and is not resent.
    first_failure = {"a": 2, "b": 0}
    assert resent == [(k, s) for s in range(6) for k in ("a", "b") if s >= first_failure[k]]
    assert sink.records_resent == len(resent)
    # At least once: every record is in the stream …
    assert {(k, d["seq"]) for k, d in fake.stream} == {(r.connection_id, r.seq) for r in batch}
    # … and a next-expected-seq consumer reads every connection complete and in order.
    assert next_expected_filter(fake.stream) == {key: list(range(6)) for key in ("a", "b", "c")}


async def test_partial_failure_keeps_order_across_chunks() -> None:
    # 700 records of one connection: chunk 1 has 500; record 499 fails. The resend of 499 must
    # go before 500..699, which were never sent.
    def fail_last_of_first_call(index: int, records: list[dict[str, Any]]) -> list[str | None]:
        if index == 0:
            return [None] * (len(records) - 1) + ["InternalFailure"]
        return [None] * len(records)

    fake = FakeKinesis(fail_last_of_first_call)
    await fake_sink(fake).write([record(seq) for seq in range(700)])
    assert [len(call) for call in fake.calls] == [500, 201]
    assert [d["seq"] for _, d in fake.stream] == list(range(700))


@pytest.mark.parametrize(
    "error",
    [
        throttle(),
        throttle("ThrottlingException"),
        throttle("InternalFailure"),
        EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
    ],
)
async def test_whole_call_errors_are_retried(error: Exception) -> None:
    fake = FakeKinesis(lambda i, records: error if i < 3 else [None] * len(records))
    await fake_sink(fake).write([record(0), record(1)])
    assert len(fake.calls) == 4
    assert [d["seq"] for _, d in fake.stream] == [0, 1]


async def test_deadline_turns_endless_throttling_into_sink_error() -> None:
    fake = FakeKinesis(lambda i, records: ["ProvisionedThroughputExceededException"] * len(records))
    sink = KinesisSink(cast(KinesisClient, fake), "fake", deadline_seconds=0.5)  # real jitter
    started = time.monotonic()
    with pytest.raises(SinkError, match=r"within 0\.5s .*2 of 2 records failed"):
        await sink.write([record(0), record(1)])
    elapsed = time.monotonic() - started
    assert 0.4 < elapsed < 2.0
    assert len(fake.calls) >= 2


async def test_deadline_covers_a_hung_call() -> None:
    class Hung(FakeKinesis):
        async def put_records(self, *, Records: list[dict[str, Any]], StreamName: str) -> dict[str, Any]:
            await asyncio.sleep(60)
            raise AssertionError("unreachable")

    sink = KinesisSink(cast(KinesisClient, Hung(lambda i, r: [])), "fake", deadline_seconds=0.2)
    with pytest.raises(SinkError, match=r"within 0\.2s"):
        await sink.write([record(0)])


class Lease:
    """A validity callback that says True `times` times, then False; it records each call."""

    def __init__(self, times: int, fake: FakeKinesis) -> None:
        self.remaining = times
        self.fake = fake
        self.asked_before_call: list[int] = []  # how many calls had been made at each ask

    def __call__(self) -> bool:
        self.asked_before_call.append(len(self.fake.calls))
        self.remaining -= 1
        return self.remaining >= 0


async def test_validity_is_asked_before_every_call_including_retries() -> None:
    fake = FakeKinesis(lambda i, records: throttle())
    lease = Lease(3, fake)
    with pytest.raises(SinkError, match="lease no longer valid") as raised:
        await fake_sink(fake).write([record(0), record(1)], valid=lease)
    assert len(fake.calls) == 3  # the fourth attempt was never sent
    assert lease.asked_before_call == [0, 1, 2, 3]
    assert raised.value.accepted == 0


async def test_a_lapsed_lease_sends_nothing() -> None:
    fake = FakeKinesis(lambda i, records: [None] * len(records))
    with pytest.raises(SinkError, match="2 of 2 records not sent"):
        await fake_sink(fake).write([record(0), record(1)], valid=lambda: False)
    assert fake.calls == []


async def test_a_lease_lost_between_chunks_reports_the_accepted_prefix() -> None:
    fake = FakeKinesis(lambda i, records: [None] * len(records))
    lease = Lease(1, fake)
    with pytest.raises(SinkError, match="200 of 700 records not sent") as raised:
        await fake_sink(fake).write([record(seq) for seq in range(700)], valid=lease)
    assert raised.value.accepted == 500
    assert [d["seq"] for _, d in fake.stream] == list(range(500))


async def test_the_deadline_reports_the_contiguous_prefix_accepted() -> None:
    # Call 0 accepts everything but a3 and b0; every later call is throttled.
    def partial_then_throttled(index: int, records: list[dict[str, Any]]) -> list[str | None] | Exception:
        if index:
            return throttle()
        failing = {("a", 3), ("b", 0)}
        keys = [(r["PartitionKey"], json.loads(r["Data"])["seq"]) for r in records]
        return ["InternalFailure" if key in failing else None for key in keys]

    only_a = [record(seq, "a") for seq in range(6)]
    with pytest.raises(SinkError, match=r"within 0\.3s") as raised:
        await fake_sink(FakeKinesis(partial_then_throttled), deadline_seconds=0.3).write(only_a)
    assert raised.value.accepted == 3  # a0..a2; a4, a5 landed too but after the hole
    mixed = [record(0, "a"), record(0, "b"), record(1, "a"), record(1, "b")]
    with pytest.raises(SinkError) as raised:
        await fake_sink(FakeKinesis(partial_then_throttled), deadline_seconds=0.3).write(mixed)
    assert raised.value.accepted == 1  # a0 only: b0 is pending


async def test_a_cancelled_write_is_cancelled() -> None:
    class Hung(FakeKinesis):
        async def put_records(self, *, Records: list[dict[str, Any]], StreamName: str) -> dict[str, Any]:
            self.calls.append(Records)
            sent.set()
            await asyncio.sleep(60)
            raise AssertionError("unreachable")

    sent = asyncio.Event()
    fake = Hung(lambda i, r: [])
    task = asyncio.ensure_future(fake_sink(fake).write([record(0)]))
    await sent.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize(
    "code", ["ValidationException", "AccessDeniedException", "ResourceNotFoundException"]
)
async def test_fatal_errors_fail_at_once(code: str) -> None:
    fake = FakeKinesis(lambda i, records: throttle(code))
    with pytest.raises(SinkError, match=code):
        await fake_sink(fake).write([record(0)])
    assert len(fake.calls) == 1


async def test_oversized_record_is_refused_without_a_call() -> None:
    fake = FakeKinesis(lambda i, records: [None] * len(records))
    with pytest.raises(SinkError, match="over the"):
        await fake_sink(fake).write([record(0, data="z" * (1024 * 1024))])
    assert fake.calls == []


async def test_calls_respect_the_record_and_byte_limits() -> None:
    fake = FakeKinesis(lambda i, records: [None] * len(records))
    big = "b" * (300 * 1024)  # ~17 records fill 5 MiB
    batch = [record(seq, f"k{seq % 4}", big) for seq in range(40)] + [record(seq) for seq in range(40, 1100)]
    await fake_sink(fake).write(batch)
    for call in fake.calls:
        assert len(call) <= MAX_RECORDS_PER_CALL
        assert sum(len(e["Data"]) + len(e["PartitionKey"]) for e in call) <= MAX_BYTES_PER_CALL
    assert len(fake.stream) == 1100
    assert len(fake.calls) >= 4


def test_plan_calls_and_go_back_n_are_pure() -> None:
    small = [_Entry("k", b"x")] * 1200
    assert plan_calls(small) == 500
    assert plan_calls(small[:3]) == 3
    huge = [_Entry("k", b"x" * (2 * 1024 * 1024))] * 4
    assert plan_calls(huge) == 2
    a0, a1, b0, a2, b1 = (
        _Entry(k, str(i).encode()) for k, i in [("a", 0), ("a", 1), ("b", 0), ("a", 2), ("b", 1)]
    )
    assert go_back_n([a0, a1, b0, a2, b1], [True, False, True, True, True]) == [a1, a2]
    assert go_back_n([a0, a1, b0, a2, b1], [True] * 5) == []
    assert go_back_n([a0, a1, b0, a2, b1], [False, True, True, True, False]) == [a0, a1, a2, b1]


# -- factory ---------------------------------------------------------------------------------


async def test_open_sink_builds_each_kind(tmp_path: Path, moto_endpoint: str, kinesis: KinesisClient) -> None:
    await create_stream(kinesis, "factory-stream", shards=1)
    session = aioboto3.Session()
    async with contextlib.AsyncExitStack() as stack:

        async def make(spec: str) -> Sink:
            return await open_sink(
                spec, worker_id="w1", stack=stack, session=session, endpoint_url=moto_endpoint, region=REGION
            )

        assert isinstance(await make("stdout"), StdoutSink)
        assert isinstance(await make("null"), NullSink)
        file_sink = await make(f"file:{tmp_path / 'sink'}")
        assert isinstance(file_sink, FileSink)
        await file_sink.write([record(0)])
        kinesis_sink = await make("kinesis:factory-stream")
        assert isinstance(kinesis_sink, KinesisSink)
        await kinesis_sink.write([record(0, "via-factory")])
    # The stack closed the sinks.
    with pytest.raises(SinkError):
        await file_sink.write([record(1)])
    with pytest.raises(SinkError):
        await kinesis_sink.write([record(1)])
    assert [line["seq"] for line in read_lines(tmp_path / "sink" / "w1.jsonl")] == [0]
    assert [key for key, _ in await read_stream(kinesis, "factory-stream")] == ["via-factory"]


@pytest.mark.parametrize(
    "spec", ["", "file", "file:", "kinesis", "kinesis:", "s3:bucket", "stdout:x", "null:1", "FILE:/x"]
)
async def test_open_sink_refuses_bad_specs(spec: str) -> None:
    async with contextlib.AsyncExitStack() as stack:
        with pytest.raises(SettingsError, match="SINK"):
            await open_sink(
                spec,
                worker_id="w1",
                stack=stack,
                session=aioboto3.Session(),
                endpoint_url=None,
                region=REGION,
            )
