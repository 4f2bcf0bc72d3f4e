"""The fault suite's own parts, without a fleet: schedules replay from their seed, the unsafe
switches refuse to start unconfirmed and move exactly what they claim, and the fault proxy's
injected errors are real DynamoDB errors to botocore."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import aioboto3
import pytest
from aiobotocore.config import AioConfig
from botocore.exceptions import ClientError

from leaseworker import unsafe
from leaseworker.chaos.observe import rss_kib, tree_rss_kib
from leaseworker.chaos.runner import JOIN_SETTLE_S, join_windows
from leaseworker.chaos.schedule import ALL_KINDS, make_schedule
from leaseworker.chaos.throttle_proxy import FaultProxyThread, Faults
from leaseworker.chaos.verdict import Evidence, judge, stale_count
from leaseworker.lease import store
from leaseworker.lease.liveness import session_deadline
from leaseworker.local.fleet import poll_until
from leaseworker.local.invariants import Delivered
from leaseworker.settings import Settings, SettingsError, load_settings
from leaseworker.supervisor.process import child_pids


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
    confirmed = {unsafe.DISABLE_VAR: "self-fencing,checkpoint-epoch", unsafe.CONFIRM_VAR: "yes"}
    assert unsafe.requested(confirmed) == unsafe.SWITCHES


@pytest.fixture
def restore_unsafe_targets() -> Iterator[None]:
    margin = Settings.__dict__["fence_margin_seconds"]
    condition = store.COND_CHECKPOINT
    yield
    setattr(Settings, "fence_margin_seconds", margin)  # noqa: B010
    store.COND_CHECKPOINT = condition


@pytest.mark.usefixtures("restore_unsafe_targets")
def test_unsafe_switches_move_both_deadlines_and_the_checkpoint_condition(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TABLE_NAME", "t")
    monkeypatch.setenv("WORKER_ID", "w")
    settings = load_settings()
    validity, session = settings.local_validity_seconds, session_deadline(0.0, settings)
    assert "attribute_not_exists(last_seq) OR last_seq < :seq" in store.COND_CHECKPOINT
    env = {unsafe.DISABLE_VAR: "self-fencing,checkpoint-epoch", unsafe.CONFIRM_VAR: "yes"}
    assert unsafe.apply_from_environment(env) == unsafe.SWITCHES
    assert settings.local_validity_seconds == validity + unsafe.UNSAFE_EXTRA_VALIDITY_SECONDS
    assert session_deadline(0.0, settings) == session + unsafe.UNSAFE_EXTRA_VALIDITY_SECONDS
    assert store.COND_CHECKPOINT == unsafe.COND_CHECKPOINT_UNFENCED
    assert all(name in store.COND_CHECKPOINT for name in (":me", ":epoch", ":seq"))  # all values used
    assert "UNSAFE TEST-ONLY SWITCH ACTIVE" in caplog.text


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
    the moves within JOIN_SETTLE_S of its start are attributed to it; later ones are churn."""
    join = 1_000_000

    def subscribe(t_ms: int, epoch: int) -> dict[str, object]:
        return {"event": "subscribe", "connection_id": "c", "epoch": epoch, "t_ms": t_ms}

    events = [
        subscribe(join - 60_000, 1),
        subscribe(join + int(JOIN_SETTLE_S * 1000) - 1, 2),  # its rebalance, just inside
        subscribe(join + int(JOIN_SETTLE_S * 1000) + 1, 3),  # after it: churn
    ]
    evidence = Evidence(1, "session", [], [], events, [], {}, join_windows([join]), set(), {}, 5.0, 1.5, 3.0)
    churn = next(row for row in judge(evidence).rows if row.name == "no churn without fault")
    assert not churn.ok
    late = join + int(JOIN_SETTLE_S * 1000) + 1
    assert churn.detail == [f"c moved at {late} ms outside every fault window"]
