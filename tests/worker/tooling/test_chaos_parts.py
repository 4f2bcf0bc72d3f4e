"""The fault suite's own parts, without a fleet: schedules replay from their seed, the unsafe
switches refuse to start unconfirmed and move exactly what they claim, and the fault proxy's
injected errors are real DynamoDB errors to botocore."""

from __future__ import annotations

import ast
import asyncio
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aioboto3
import pytest
from aiobotocore.config import AioConfig
from botocore.exceptions import ClientError

import leaseworker
from leaseworker.lease import connection_expressions
from leaseworker.lease.liveness import session_deadline
from leaseworker.settings import Settings, SettingsError, load_settings
from leaseworker.supervisor.process import child_pids
from leaseworker.worker import peers
from leaseworker.worker.acquirer import Acquirer
from leaseworker.worker.audit import Audit
from leaseworker.worker.checkpointer import Checkpointer
from leaseworker_dev.chaos import unsafe, unsafe_worker
from leaseworker_dev.chaos.nemeses import EXIT_FENCED, Measure
from leaseworker_dev.chaos.observe import TableReading, rss_kib, tree_rss_kib
from leaseworker_dev.chaos.runner import JOIN_SETTLE_S, join_windows
from leaseworker_dev.chaos.schedule import ALL_KINDS, make_schedule
from leaseworker_dev.chaos.table_history import fenced_by_peers
from leaseworker_dev.chaos.throttle_proxy import (
    FaultProxyThread,
    Faults,
    is_claim_request,
    is_release_request,
)
from leaseworker_dev.chaos.verdict import Evidence, judge, stale_count
from leaseworker_dev.local.fleet import poll_until
from leaseworker_dev.local.invariants import Delivered


def test_one_seed_replays_one_schedule() -> None:
    first = make_schedule(1234, 120, "session")
    again = make_schedule(1234, 120, "session")
    other = make_schedule(1235, 120, "session")
    assert first == again
    assert first.as_json() == again.as_json()
    assert first != other
    assert first.kinds() == set(ALL_KINDS), "a 2-minute schedule covers every kind"


def test_schedule_is_sequential_and_fits() -> None:
    schedule = make_schedule(7, 60, "connection")
    ends = 0.0
    for nemesis in schedule.nemeses:
        assert nemesis.at >= ends, "nemeses never overlap"
        ends = nemesis.at + nemesis.duration + nemesis.recovery
    assert ends <= 60
    prefix = schedule.until(30)
    assert prefix.nemeses == tuple(n for n in schedule.nemeses if n.at + n.duration + n.recovery <= 30)


def test_far_clock_skew_only_in_session_mode() -> None:
    for seed in range(30):
        for n in make_schedule(seed, 120, "connection", kinds=("clock",)).nemeses:
            assert not n.params["beyond_skew"] and abs(n.params["offset_s"]) < 0.2


def test_unsafe_switch_is_refused_without_confirmation() -> None:
    assert unsafe.requested({}) == frozenset()
    with pytest.raises(SettingsError, match="LEASEWORKER_UNSAFE_I_KNOW=yes"):
        unsafe.requested({unsafe.DISABLE_VAR: "self-fencing"})
    with pytest.raises(SettingsError, match="unknown"):
        unsafe.requested({unsafe.DISABLE_VAR: "everything", unsafe.CONFIRM_VAR: "yes"})
    confirmed = {unsafe.DISABLE_VAR: ",".join(sorted(unsafe.SWITCHES)), unsafe.CONFIRM_VAR: "yes"}
    assert unsafe.requested(confirmed) == unsafe.SWITCHES


@pytest.fixture
def restore_unsafe_targets() -> Iterator[None]:
    margin = Settings.__dict__["fence_margin_seconds"]
    condition = connection_expressions.COND_CHECKPOINT
    yield
    setattr(Settings, "fence_margin_seconds", margin)  # noqa: B010
    connection_expressions.COND_CHECKPOINT = condition


@pytest.mark.usefixtures("restore_unsafe_targets")
def test_unsafe_switches_move_both_deadlines_and_the_checkpoint_condition(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TABLE_NAME", "t")
    monkeypatch.setenv("WORKER_ID", "w")
    settings = load_settings()
    validity, session = settings.local_validity_seconds, session_deadline(0.0, settings)
    assert "attribute_not_exists(last_seq) OR last_seq < :seq" in connection_expressions.COND_CHECKPOINT
    env = {unsafe.DISABLE_VAR: "self-fencing,checkpoint-epoch", unsafe.CONFIRM_VAR: "yes"}
    assert unsafe.apply_from_environment(env) == {unsafe.SELF_FENCING, unsafe.CHECKPOINT_EPOCH}
    assert settings.local_validity_seconds == validity + unsafe.UNSAFE_EXTRA_VALIDITY_SECONDS
    assert session_deadline(0.0, settings) == session + unsafe.UNSAFE_EXTRA_VALIDITY_SECONDS
    assert connection_expressions.COND_CHECKPOINT == unsafe.COND_CHECKPOINT_UNFENCED
    assert all(
        name in connection_expressions.COND_CHECKPOINT for name in (":me", ":epoch", ":seq")
    )  # all values used
    assert "UNSAFE TEST-ONLY SWITCH ACTIVE" in caplog.text


DEV_PACKAGE = Path(unsafe.__file__).parents[1]  # dev_src/leaseworker_dev
PRODUCT = Path(leaseworker.__file__).parent  # worker_src/leaseworker: what the image ships
# The product's one reference to the development package: `leaseworker local` is registered from
# it when it is installed (cli/main.register_local, an import by name), and said to be missing
# otherwise.
PRODUCT_TO_DEV = {"cli/main.py": {"leaseworker_dev", "leaseworker_dev.cli"}}
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _imports_and_module_names(path: Path) -> set[str]:
    """Imports, and string constants that are module names (`importlib.import_module`'s kind)."""
    constants = {
        node.value
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and MODULE_NAME.fullmatch(node.value)
    }
    return _imports(path) | constants


def _dev_or_unsafe(name: str) -> bool:
    return name.split(".", maxsplit=1)[0] == "leaseworker_dev" or name.endswith("unsafe")


def test_the_product_never_reaches_the_development_package_or_the_unsafe_switches() -> None:
    """The product (`leaseworker run`, the image's command) imports nothing from the development
    package but the guarded registration of `leaseworker local`; within that package, only the
    chaos runner's own worker entry point applies the switches."""
    reaching = {
        str(path.relative_to(PRODUCT)): found
        for path in PRODUCT.rglob("*.py")
        if (
            found := {
                n
                for n in _imports_and_module_names(path)
                if n.split(".")[0] == "leaseworker_dev" or n.endswith("unsafe")
            }
        )
    }
    assert reaching == PRODUCT_TO_DEV, f"the product reaches the development package: {reaching}"
    applying = {
        str(path.relative_to(DEV_PACKAGE))
        for path in DEV_PACKAGE.rglob("*.py")
        if "leaseworker_dev.chaos.unsafe.apply_from_environment" in _imports(path)
        or ("leaseworker_dev.chaos.unsafe" in _imports(path) and path.parent.name != "chaos")
    }
    assert applying <= {"chaos/unsafe_worker.py"}, applying
    assert "leaseworker_dev.chaos.unsafe" in _imports(DEV_PACKAGE / "chaos" / "unsafe_worker.py")


@pytest.mark.parametrize(
    ("argv", "env", "phrase"),
    [
        (["--child"], {unsafe.DISABLE_VAR: unsafe.SELF_FENCING}, unsafe.CONFIRM_VAR),
        (["--child"], {unsafe.DISABLE_VAR: "everything", unsafe.CONFIRM_VAR: "yes"}, "unknown switch"),
        (["extra"], {}, "usage:"),
    ],
)
def test_the_unsafe_entry_point_refuses_in_one_line(
    argv: list[str], env: dict[str, str], phrase: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", unsafe_worker.MODULE, *argv],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done
    assert phrase in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr


RESUME_SEQ = "resume_seq"  # imported into worker.peers, where the takeover-resume switch patches it


@pytest.fixture
def restore_issue20_targets() -> Iterator[None]:
    saved = [
        (Acquirer, "_resolve", Acquirer.__dict__["_resolve"]),
        (Audit, "round", Audit.__dict__["round"]),
        (Checkpointer, "round", Checkpointer.__dict__["round"]),
        (peers, RESUME_SEQ, getattr(peers, RESUME_SEQ)),
    ]
    yield
    for owner, name, value in saved:
        setattr(owner, name, value)


@pytest.mark.usefixtures("restore_issue20_targets")
async def test_issue20_switches_break_exactly_what_they_name() -> None:
    resolve, audit_round, checkpoint_round = Acquirer._resolve, Audit.round, Checkpointer.round
    assert getattr(peers, RESUME_SEQ)({"c": (4, 90)}, "c", 4) == 90
    env = {
        unsafe.DISABLE_VAR: f"{unsafe.LOST_CLAIM},{unsafe.TAKEOVER_RESUME},{unsafe.RELEASING_ENTRY}",
        unsafe.CONFIRM_VAR: "yes",
    }
    assert unsafe.apply_from_environment(env) == {
        unsafe.LOST_CLAIM,
        unsafe.TAKEOVER_RESUME,
        unsafe.RELEASING_ENTRY,
    }
    assert Acquirer._resolve is not resolve and Audit.round is not audit_round
    assert await Acquirer._resolve(object(), object()) is None  # type: ignore[arg-type]
    assert await Audit.round(object()) == 0  # type: ignore[arg-type]
    assert getattr(peers, RESUME_SEQ)({"c": (4, 90)}, "c", 4) == -1  # the dead holder's entry ignored
    assert Checkpointer.round is not checkpoint_round


def test_verdict_names_a_stranded_connection_with_its_owner_and_duration() -> None:
    """Held by a live (heartbeating, unfenced) w1 at epoch 5 with nobody subscribed: stranded once
    that lasts past the bound; a fenced or silent owner, or a subscriber at the epoch, is not."""

    def reading(t: int, hb: int, *, fenced: bool = False, owner: str = "w1") -> TableReading:
        return TableReading(
            t, {"c": 10}, {"c": (owner, 5)}, {"c": "STARTED"}, {}, {"w1": (hb, fenced), "w2": (1, False)}
        )

    events: list[dict[str, object]] = [
        {"event": "subscribe", "session": 1, "connection_id": "c", "epoch": 4, "t_ms": 0},
        {"event": "close", "session": 1, "connection_id": "c", "epoch": 4, "t_ms": 1_000},
        {"event": "subscribe", "session": 2, "connection_id": "c", "epoch": 5, "t_ms": 20_000},
    ]
    readings = [reading(t, t // 1000) for t in range(0, 25_000, 250)]  # w1 beats every second

    def judged(readings: list[TableReading]) -> Any:
        evidence = Evidence(
            1, "session", [], readings, events, [], {}, [], set(), {}, 7.5, 1.5, 3.0, lease_s=3.0
        )
        return next(row for row in judge(evidence).rows if row.name == "L1 no stranding")

    row = judged(readings)
    assert not row.ok
    assert row.detail == ["c: STARTED, held by live w1 at epoch 5, no subscriber for 19.8 s from 0 ms"], (
        "the epoch-4 subscriber does not serve epoch 5; the epoch-5 one at 20 s ends it"
    )
    silent = [reading(t, 0) for t in range(0, 25_000, 250)]  # w1's hb never moves: dead to peers
    assert judged(silent).ok
    fenced = [reading(t, t // 1000, fenced=True) for t in range(0, 25_000, 250)]
    assert judged(fenced).ok
    short = [r for r in readings if r.t_ms < 7_000]  # 6.75 s unserved: within the bound
    assert judged(short).ok


async def _get_item_through(url: str) -> str:
    async with aioboto3.Session().client(
        "dynamodb",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
        config=AioConfig(retries={"total_max_attempts": 1}),
    ) as client:
        try:
            await client.list_tables()
        except ClientError as error:
            return str(error.response["Error"]["Code"])
        return "ok"


@pytest.mark.parametrize("code", ["ProvisionedThroughputExceededException", "ThrottlingException"])
def test_fault_proxy_answers_real_dynamodb_throttling_errors(dynamodb_endpoint: str, code: str) -> None:
    port = int(dynamodb_endpoint.rsplit(":", 1)[1])
    proxy = FaultProxyThread("127.0.0.1", port)
    with proxy:
        assert asyncio.run(_get_item_through(proxy.url)) == "ok"
        proxy.set_faults(Faults(throttle_rate=1.0, throttle_code=code))
        assert asyncio.run(_get_item_through(proxy.url)) == code
        assert proxy.injected() == 1
        proxy.set_faults(Faults())
        assert asyncio.run(_get_item_through(proxy.url)) == "ok"


async def _put_then_update_through(url: str, table: str) -> str:
    async with aioboto3.Session().client(
        "dynamodb",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
        config=AioConfig(retries={"total_max_attempts": 1}, read_timeout=1, connect_timeout=1),
    ) as client:
        try:
            await client.update_item(
                TableName=table,
                Key={"connection_id": {"S": "c-lost"}},
                UpdateExpression="SET lease_owner = :me ADD lease_epoch :one",
                ExpressionAttributeValues={":me": {"S": "w1"}, ":one": {"N": "1"}},
            )
        except Exception as error:
            return type(error).__name__
        return "ok"


@pytest.mark.parametrize("how", ["drop", "delay"])
async def test_fault_proxy_applies_a_request_and_loses_its_reply(
    ddb: Any, table: str, dynamodb_endpoint: str, how: str
) -> None:
    port = int(dynamodb_endpoint.rsplit(":", 1)[1])
    proxy = FaultProxyThread("127.0.0.1", port)
    with proxy:
        proxy.set_faults(Faults(lose_claim_rate=1.0, lose_how=how, lose_delay=3.0))
        outcome = await _put_then_update_through(proxy.url, table)
        assert outcome != "ok"  # the client saw a reset or its read timeout ...
        item = await ddb.get_item(
            TableName=table, Key={"connection_id": {"S": "c-lost"}}, ConsistentRead=True
        )
        assert item["Item"]["lease_epoch"]["N"] == "1"  # ... yet DynamoDB applied the claim once
        lost = {"drop": int(how == "drop"), "delay": int(how == "delay"), "claims": 1, "releases_held": 0}
        assert proxy.lost() == lost
        proxy.set_faults(Faults())
        assert await _put_then_update_through(proxy.url, table) == "ok"


def test_only_claims_meet_the_claim_rate() -> None:
    head = b"POST / HTTP/1.1\r\nX-Amz-Target: DynamoDB_20120810.UpdateItem\r\n\r\n"
    claim = head + b'{"UpdateExpression": "SET lease_owner = :me ADD lease_epoch :one"}'
    renew = head + b'{"UpdateExpression": "SET hb = :hb"}'
    faults = Faults(lose_rate=0.1, lose_claim_rate=0.8)
    assert is_claim_request(claim) and not is_claim_request(renew)
    assert faults.lose_chance(claim) == 0.8 and faults.lose_chance(renew) == 0.1


def test_only_writes_that_remove_the_owner_are_held_as_releases() -> None:
    head = b"POST / HTTP/1.1\r\nX-Amz-Target: DynamoDB_20120810.UpdateItem\r\n\r\n"
    release = head + b'{"UpdateExpression": "SET lease_expires_at_ms = :zero REMOVE lease_owner"}'
    checkpoint = head + b'{"UpdateExpression": "SET last_seq = :seq"}'
    assert is_release_request(release) and not is_release_request(checkpoint)


def test_verdict_counts_stale_arrivals_and_names_s1() -> None:
    def d(seq: int, epoch: int) -> Delivered:
        return Delivered("c", seq, epoch, f"w{epoch}", 0)

    clean = [d(0, 1), d(1, 1), d(1, 2), d(2, 2)]
    late = [d(0, 1), d(1, 2), d(2, 1), d(3, 2)]  # epoch 1 lands after epoch 2 began
    assert stale_count(clean) == 0
    assert stale_count(late) == 1
    evidence = Evidence(1, "session", late, [], [], [], {}, [], set(), {}, 5.0, 1.5, 3.0)
    verdict = judge(evidence)
    assert verdict.failed() == ["S1 one deliverer"]
    assert verdict.counts["stale"] == 1


def test_a_workers_memory_is_its_supervisor_and_its_child() -> None:
    # A parent that allocates little and a child that holds ~40 MB: the sampled worker is both.
    child = "b = bytearray(40 * 1024 * 1024); import time; time.sleep(30)"
    parent = (
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(30)"
    )
    process = subprocess.Popen([sys.executable, "-c", parent])
    try:
        assert poll_until(lambda: len(child_pids(process.pid)) == 1, 10)
        assert poll_until(lambda: (tree_rss_kib(process.pid) or 0) > 40 * 1024, 10)
        own = rss_kib(process.pid) or 0
        assert own < 40 * 1024 < (tree_rss_kib(process.pid) or 0)
    finally:
        for pid in child_pids(process.pid):
            os.kill(pid, signal.SIGKILL)
        process.kill()
        process.wait()


def test_moves_onto_a_joining_worker_are_its_rebalance_not_churn() -> None:
    """A worker started mid-run (a replacement after a fault, a scale-out) is a fleet change:
    the moves within JOIN_SETTLE_S of its session's first appearance in the table are
    attributed to it, however long its start-up took; later ones are churn."""
    spawned = 1_000_000
    joined = spawned + 15_000  # a start-up on busy cores

    def subscribe(t_ms: int, epoch: int) -> dict[str, object]:
        return {"event": "subscribe", "connection_id": "c", "epoch": epoch, "t_ms": t_ms}

    def reading(t_ms: int, *sessions: str) -> TableReading:
        return TableReading(t_ms, {}, {}, sessions={name: (1, False) for name in sessions})

    settle_ms = int(JOIN_SETTLE_S * 1000)
    events = [
        subscribe(spawned - 60_000, 1),
        subscribe(joined + settle_ms - 1, 2),  # its rebalance, just inside
        subscribe(joined + settle_ms + 1, 3),  # after it: churn
    ]
    readings = [reading(spawned - 250, "w1"), reading(joined - 250, "w1"), reading(joined, "w1", "w2")]
    windows = join_windows([("w2", spawned)], readings)
    assert windows == [("join", spawned, joined + settle_ms)]
    evidence = Evidence(1, "session", [], [], events, [], {}, windows, set(), {}, 5.0, 1.5, 3.0)
    churn = next(row for row in judge(evidence).rows if row.name == "no churn without fault")
    assert not churn.ok
    assert churn.detail == [f"c moved at {joined + settle_ms + 1} ms outside every fault window"]
    # A joiner that never wrote its session caused nothing after its own settling time.
    assert join_windows([("w3", spawned)], readings) == [("join", spawned, spawned + settle_ms)]


def test_exit_3_is_owed_by_a_fenced_victim_and_an_unfenced_one_may_run_on() -> None:
    """A pause or stall past the lease is fenced only if peers saw it silent for a whole lease;
    the exit row asks exit 3 of a victim some peer fenced, and lets an unfenced one run on."""
    paused = Measure("sigstop", "L1", 0, "w6", {}, expect_exit=EXIT_FENCED)
    killed = Measure("sigkill group", "L1", 0, "w2", {}, expect_exit=-signal.SIGKILL)

    def row(exits: dict[str, int | None], fenced: set[str]) -> Any:
        evidence = Evidence(
            1, "session", [], [], [], [paused, killed], exits, [], set(), {}, 7.5, 1.5, 3.0, fenced=fenced
        )
        return next(row for row in judge(evidence).rows if row.name == "exit statuses")

    assert row({"w6": 3, "w2": -9}, {"w6"}).ok
    unfenced = row({"w6": None, "w2": -9}, set())
    assert unfenced.ok and "1 never fenced" in unfenced.figure
    assert not row({"w6": None, "w2": -9}, {"w6"}).ok, "fenced, it must exit 3"
    assert not row({"w6": 0, "w2": -9}, set()).ok, "an exit other than 3 is never right"
    assert not row({"w6": 3, "w2": None}, set()).ok, "a killed worker is not excused by the fence rule"


def test_fenced_by_peers_reads_the_session_items_fences_and_not_a_clean_exit() -> None:
    def write(key: str, **image: str) -> dict[str, Any]:
        return {"NewImage": {k: {"S": v} for k, v in {"connection_id": key, **image}.items()}}

    records = [
        write("worker#w6", fenced_by="w3"),  # a peer's fence
        write("worker#w4", fenced_by="w4"),  # its own clean exit
        write("worker#w5"),  # a heartbeat
        write("worker#w7#ckpt", fenced_by="w1"),  # a checkpoint item, not a session
        write("c-1", fenced_by="w2"),  # not a worker's item
    ]
    assert fenced_by_peers(records) == {"w6"}
