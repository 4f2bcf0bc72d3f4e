"""The bad-input catalogue (docs/bad-input.md): every case against one real worker at once.

One worker (in-process, DynamoDB Local, the file sink) owns every faulty connection of the
catalogue plus two healthy ones for RUN_SECONDS. Each case is then its own test, judged from
outside: the item (owner, epoch, state, `last_error`), the metrics counted under its
connection id, the log lines carrying its connection id, and the sink. The healthy connections
must lose nothing, and no faulty one may change owner: a crash that released its lease would be
re-acquired at epoch 2.
"""

from __future__ import annotations

import asyncio
import io
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aioboto3
import pytest
import pytest_asyncio

from leaseworker.aws import LEASE_CLIENT_CONFIG
from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.observability.logging import configure_logging, current_log_context
from leaseworker.observability.metrics import MetricName, WorkerMetrics
from leaseworker.records import SinkRecord
from leaseworker.settings import Settings
from leaseworker.sinks.base import SinkError, Validity, always_valid
from leaseworker.sinks.file import FileSink
from leaseworker.worker import session as session_module
from leaseworker.worker import upstream as upstream_module
from leaseworker_dev.feed.server import FAULT_AFTER, FeedServer
from leaseworker_dev.local.invariants import Delivered, Report, check_s2, read_sink
from leaseworker_dev.local.services import free_port
from tests.worker.bad_upstream import GOOD_BEFORE, ScriptedUpstream
from tests.worker.harness import running

RUN_SECONDS = 14.0
# Scaled from 10 s so the never-upgrading upstream fails a few times in RUN_SECONDS. Not 1 s: on
# CI's loaded host (xdist beside Java and node) that timed out the healthy handshakes of three
# cases, whose last_error then said "timed out during opening handshake".
OPEN_TIMEOUT = 3.0
HEALTHY = ("healthy-1", "healthy-2")
HEALTHY_RATE = 50.0
WORKER_ID = "catalogue-worker"
SINK_CRASH = "sink-crash"
SINK_CRASH_GRACE_SECONDS = 20.0  # beyond RUN_SECONDS, for the fifth crash of a loaded host
SINK_PARTIAL = "sink-partial"

P = MetricName.ProtocolErrors
R = MetricName.Reconnects
S = MetricName.SinkErrors


@dataclass
class Upstreams:
    scripted: ScriptedUpstream
    feed: FeedServer
    refused_port: int


@dataclass(frozen=True)
class Case:
    id: str
    url: Callable[[Upstreams, str], str]  # (upstreams, connection id) -> ws_url
    last_error: str | None  # a substring of the item's last_error; None: no error at all
    metric: MetricName | None  # counted under this connection's id
    log: str  # a log message seen with this connection's id
    delivers: int = GOOD_BEFORE  # at least this many records reach the sink, contiguous from 0
    state: str = "STARTED"


def scripted(name: str, scheme: str = "ws") -> Callable[[Upstreams, str], str]:
    return lambda up, cid: up.scripted.url(name, scheme=scheme)


def feed(mode: str | None) -> Callable[[Upstreams, str], str]:
    return lambda up, cid: up.feed.url_for(cid, mode=mode) if mode else up.feed.url_for(cid)


def proto(name: str, what: str) -> Case:
    return Case(name, scripted(name), f"protocol error: {what}", P, "protocol error; resubscribing")


def closed(name: str, code: int, delivers: int = GOOD_BEFORE) -> Case:
    return Case(name, scripted(name), f"received {code}", R, "reconnecting", delivers=delivers)


CASES: list[Case] = [
    # What UTF-8 cannot carry is delivered, escaped, and nothing breaks.
    Case("feed-surrogate", feed("surrogate"), None, MetricName.MessagesDelivered, "subscribed", delivers=20),
    # Nesting.
    Case("feed-deep", feed("deep"), "protocol error: too_deep", P, "protocol error; resubscribing"),
    proto("deep-200", "too_deep"),
    # Closes right after the handshake, before or while the subscribe is sent.
    closed("close-at-open-1008", 1008, delivers=0),
    closed("close-at-open-1013", 1013, delivers=0),
    # Closes after some records, with each code.
    closed("close-1000", 1000),
    closed("close-1001", 1001),
    closed("close-1008", 1008),
    closed("close-1011", 1011),
    closed("close-1013", 1013),
    Case("feed-close", feed("close"), "received 1011", R, "reconnecting", delivers=0),
    # Frames that are not what seqfeed/1 allows.
    proto("binary", "binary"),
    proto("array", "bad_frame: not a JSON object"),
    proto("null", "bad_frame: not a JSON object"),
    proto("missing-seq", "bad_frame: data frame without 'seq'"),
    proto("missing-data", "bad_frame: data frame without 'data'"),
    proto("missing-type", "bad_frame: missing 'type'"),
    proto("unknown-type", "unexpected"),
    proto("seq-string", "bad_frame: data frame 'seq' is not an integer"),
    proto("seq-bool", "bad_frame: data frame 'seq' is not an integer"),
    proto("seq-float", "bad_frame: data frame 'seq' is not an integer"),
    proto("negative-seq", "bad_frame: data frame 'seq' is not an integer >= 0"),
    proto("nan", "bad_json"),
    proto("infinity", "bad_json"),
    proto("minus-infinity", "bad_json"),
    proto("float-overflow", "bad_json"),
    proto("huge-int", "bad_json"),
    proto("invalid-utf8", "invalid UTF-8 in a text frame"),
    Case("feed-garbage", feed("garbage"), "protocol error: bad_json", P, "protocol error; resubscribing"),
    Case(
        "feed-oversized", feed("oversized"), "protocol error: oversized", P, "protocol error; resubscribing"
    ),
    # Sequence trouble.
    Case("feed-gap", feed("gap"), "protocol error: gap", P, "protocol error; resubscribing"),
    proto("huge-seq", "gap"),
    Case(
        "overlapping-replay",
        scripted("overlapping-replay"),
        "received 1000",
        R,
        "overlapping replay dropped",
        20,
    ),
    Case("feed-replay", feed("replay"), None, MetricName.MessagesDelivered, "overlapping replay dropped", 20),
    Case("feed-error", feed("error"), "upstream error unavailable", R, "upstream error frame", delivers=0),
    # Upstreams that never let a session start, or drop it at once, forever.
    Case("hang", lambda up, cid: up.scripted.hang_url, "connect failed: TimeoutError", R, "reconnecting", 0),
    Case("feed-drop", feed("drop"), "upstream closed", R, "reconnecting", delivers=1),
    Case(
        "refused",
        lambda up, cid: f"ws://127.0.0.1:{up.refused_port}/feeds/refused",
        "connect failed: ConnectionRefusedError",
        R,
        "reconnecting",
        delivers=0,
    ),
    Case("tls-to-plain", scripted("close-1000", "wss"), "connect failed: ", R, "reconnecting", 0),
    # The sink: a partial accept advances by its prefix; a sink bug fails the connection.
    Case(SINK_PARTIAL, feed(None), "sink error: partial", S, "sink refused a batch; resubscribing", 20),
    Case(
        SINK_CRASH,
        feed(None),
        "failed: session crashed 5 times: RuntimeError: scripted sink bug",
        R,
        "connection marked failed",
        delivers=0,
        state="STOPPED",
    ),
]


class CatalogueSink:
    """The file sink, with a sink bug for SINK_CRASH and a partial accept for SINK_PARTIAL."""

    def __init__(self, inner: FileSink) -> None:
        self._inner = inner

    async def write(self, records: Sequence[SinkRecord], *, valid: Validity = always_valid) -> None:
        cid = records[0].connection_id
        if cid == SINK_CRASH:
            raise RuntimeError("scripted sink bug")
        if cid == SINK_PARTIAL and len(records) >= 2:
            half = len(records) // 2
            await self._inner.write(records[:half], valid=valid)
            raise SinkError("partial: the second half was refused", accepted=half)
        await self._inner.write(records, valid=valid)

    async def close(self) -> None:
        await self._inner.close()


@dataclass
class Outcome:
    items: dict[str, dict[str, Any]]
    records: dict[str, list[Delivered]]
    not_strict: list[str]
    surrogate_data: list[Any]  # the data of every feed-surrogate record at seq FAULT_AFTER
    metrics: Counter[tuple[str, MetricName]]
    logs: list[dict[str, Any]]
    opens: Counter[str]
    worker_survived: bool
    urls: dict[str, str] = field(default_factory=dict)

    def logged(self, cid: str, message: str) -> list[dict[str, Any]]:
        return [line for line in self.logs if line.get("connection_id") == cid and line["message"] == message]


def _not_strict(path: Path) -> list[str]:
    """The sink lines that are not strict JSON (NaN, Infinity) or not UTF-8."""

    def refuse(name: str) -> Any:
        raise ValueError(name)

    bad = []
    for line in path.read_bytes().splitlines():
        try:
            json.loads(line.decode("utf-8"), parse_constant=refuse)
        except ValueError:
            bad.append(line[:200].decode("utf-8", "replace"))
    return bad


def _data_of(path: Path, cid: str, seq: int) -> list[Any]:
    lines = (json.loads(line) for line in path.read_text(encoding="utf-8").splitlines())
    return [line["data"] for line in lines if line["connection_id"] == cid and line["seq"] == seq]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def outcome(dynamodb_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Outcome]:
    sink_dir = tmp_path_factory.mktemp("catalogue-sink")
    table = f"catalogue-{uuid.uuid4().hex[:8]}"
    # Bad input, not lease timing, is under test: lease 6 s / heartbeat 2 s leave a heartbeat
    # 3.4 s of slack. At 3 s / 1 s (1.4 s), a heartbeat delayed by a loaded CI machine's other
    # tests once self-fenced a healthy connection (a `last_error` on healthy-1).
    settings = Settings(
        table_name=table,
        lease_seconds=6.0,
        heartbeat_seconds=2.0,
        reconcile_seconds=1.0,
        checkpoint_seconds=1.0,
        max_clock_skew_ms=200,
        worker_id=WORKER_ID,
        endpoint_url=dynamodb_endpoint,
        region="us-east-1",
        sink=f"file:{sink_dir}",
    )
    tally: Counter[tuple[str, MetricName]] = Counter()
    original_count = WorkerMetrics.count

    def count(self: WorkerMetrics, name: MetricName, value: float = 1) -> None:
        tally[(str(current_log_context().get("connection_id")), name)] += int(value)
        original_count(self, name, value)

    log = io.StringIO()
    items: dict[str, dict[str, Any]] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(upstream_module, "OPEN_TIMEOUT_SECONDS", OPEN_TIMEOUT)
        patch.setattr(WorkerMetrics, "count", count)
        configure_logging("INFO", stream=log)
        try:
            async with (
                aioboto3.Session().client(
                    "dynamodb",
                    endpoint_url=dynamodb_endpoint,
                    region_name="us-east-1",
                    config=LEASE_CLIENT_CONFIG,
                ) as ddb,
                ScriptedUpstream() as scripted_upstream,
                FeedServer(rate=HEALTHY_RATE) as feed_server,
            ):
                admin = LeaseTableAdmin(ddb, table)
                assert await admin.create_table()
                ups = Upstreams(scripted_upstream, feed_server, free_port())
                urls = {case.id: case.url(ups, case.id) for case in CASES}
                for cid in HEALTHY:
                    urls[cid] = feed_server.url_for(cid)
                for cid, url in urls.items():
                    await admin.add(cid, url)
                sink = CatalogueSink(FileSink(sink_dir, WORKER_ID))
                async with running(settings, sink=sink) as run:
                    await asyncio.sleep(RUN_SECONDS)
                    # The sink-crash case needs five crashes with their reconnect pacing, and CI
                    # saw the fifth miss RUN_SECONDS (each crash then also waited for its socket's
                    # close; those now close in the background, worker/upstream.py).
                    for _ in range(int(SINK_CRASH_GRACE_SECONDS / 0.5)):
                        if (await admin.show(SINK_CRASH)).get("desired_state") == "STOPPED":
                            break
                        await asyncio.sleep(0.5)
                    survived = not run.task.done()
                    # Read while the worker still runs: its shutdown releases every lease.
                    items = {item["connection_id"]: item for item in await admin.list()}
                opens = Counter(scripted_upstream.opens)
        finally:
            configure_logging("INFO", stream=None)
    logs = [json.loads(line) for line in log.getvalue().splitlines() if line.startswith("{")]
    sink_file = sink_dir / f"{WORKER_ID}.jsonl"
    yield Outcome(
        items=items,
        records=read_sink(sink_dir),
        not_strict=_not_strict(sink_file),
        surrogate_data=_data_of(sink_file, "feed-surrogate", FAULT_AFTER),
        metrics=tally,
        logs=logs,
        opens=opens,
        worker_survived=survived,
        urls=urls,
    )


def _contiguous(records: list[Delivered]) -> list[str]:
    report = Report()
    check_s2({"c": records}, report)
    return report.violations


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_case(outcome: Outcome, case: Case) -> None:
    item = outcome.items[case.id]
    # What the connection's session logged, with times: how far it got if it did not get there.
    story = [
        (line.get("timestamp", "")[11:23], line["message"])
        for line in outcome.logs
        if line.get("connection_id") == case.id
    ]
    assert item["desired_state"] == case.state, (item, story[-12:])
    if case.state == "STARTED":
        # Still with its first owner: never released and re-acquired (that would be epoch 2).
        assert item.get("lease_owner") == WORKER_ID, item
        assert item["lease_epoch"] == 1, item
    if case.last_error is None:
        assert "last_error" not in item, item
    else:
        assert case.last_error in item.get("last_error", ""), item
    if case.metric is not None:
        assert outcome.metrics[(case.id, case.metric)] >= 1, case.metric
    assert outcome.logged(case.id, case.log), f"no {case.log!r} log line for {case.id}"
    assert not outcome.logged(case.id, "session crashed; keeping the lease and backing off") or (
        case.id == SINK_CRASH
    )
    records = outcome.records.get(case.id, [])
    assert len({r.seq for r in records}) >= case.delivers, len(records)
    if records:
        # Everything valid before each fault was delivered, in order, and nothing twice.
        assert _contiguous(records) == []


def test_the_catalogue_has_at_least_25_cases() -> None:
    assert len(CASES) >= 25
    assert len({case.id for case in CASES}) == len(CASES)


def test_the_worker_stayed_up_and_healthy_connections_lost_nothing(outcome: Outcome) -> None:
    assert outcome.worker_survived
    for cid in HEALTHY:
        records = outcome.records[cid]
        assert _contiguous(records) == []
        assert len(records) >= HEALTHY_RATE * RUN_SECONDS * 0.6, len(records)
        assert outcome.items[cid]["lease_epoch"] == 1
        assert "last_error" not in outcome.items[cid], outcome.items[cid].get("last_error")


def test_the_sink_holds_strict_json_and_the_lone_surrogate_intact(outcome: Outcome) -> None:
    assert outcome.not_strict == []  # no NaN, no Infinity, every line UTF-8
    assert outcome.surrogate_data, "the frame with the lone surrogate was not delivered"
    for data in outcome.surrogate_data:
        assert data["text"] == "\ud800"  # exactly what the upstream's JSON said


def test_a_sink_bug_fails_the_connection_after_five_crashes_not_before(outcome: Outcome) -> None:
    crashes = outcome.logged(SINK_CRASH, "session crashed; keeping the lease and backing off")
    assert len(crashes) == session_module.MAX_CONSECUTIVE_CRASHES
    assert SINK_CRASH not in {r.connection_id for rs in outcome.records.values() for r in rs}


def test_an_upstream_that_drops_after_one_record_is_not_hammered(outcome: Outcome) -> None:
    # Backoff 0.2 s doubling with jitter (at least half): at most ~8 attempts in RUN_SECONDS.
    # Resetting the backoff after each record would reconnect every ~0.1-0.2 s: 50+ attempts.
    attempts = outcome.metrics[("feed-drop", MetricName.Reconnects)]
    assert 3 <= attempts <= 10, attempts
    assert 3 <= outcome.opens["close-1000"] <= 10, outcome.opens


def test_overlapping_replays_are_dropped_not_delivered_twice(outcome: Outcome) -> None:
    for cid in ("overlapping-replay", "feed-replay"):
        dropped = outcome.logged(cid, "overlapping replay dropped")
        assert sum(line["dropped"] for line in dropped) >= 1
        assert _contiguous(outcome.records[cid]) == []
