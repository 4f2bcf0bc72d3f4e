"""`make cost` (stacks/cost.py): the same context as synth, the stack's real counts, docs/cost.md in step."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import subprocess
import sys

import pytest

from bench import model
from stacks import cost
from stacks import cost_prices as prices
from stacks.config import LeaseworkerConfig, load_config
from tests.infra.conftest import REPO, Synth

DOC = REPO / "docs" / "cost.md"
# In docs/cost.md, each generated table follows a line `<!-- make cost ARGS="..." -->`.
MARKER = re.compile(r'<!-- make cost ARGS="([^"]*)" -->\n')


def run_cost(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cost.main(list(args)) == 0
    return out.getvalue()


def parse(context: dict[str, str]) -> LeaseworkerConfig:
    return load_config(context.get)


def test_alarm_counts_are_the_stacks(default: Synth) -> None:
    alarms = default.resources("AWS::CloudWatch::Alarm").values()
    metrics = sum(
        len([m for m in a["Properties"].get("Metrics", []) if "MetricStat" in m]) or 1 for a in alarms
    )
    assert (len(alarms), metrics) == (cost.ALARMS, cost.ALARM_METRICS)


def test_tasks_follow_the_scaling_policy() -> None:
    config = parse({})
    assert [cost.tasks_for(config, n) for n in (1, 700, 701, 2000, 10000, 50000)] == [1, 1, 2, 3, 10, 10]
    prod = parse({"stage": "prod"})
    assert cost.tasks_for(prod, 1) == 2  # prod's floor


def test_dynamodb_matches_benchmarks_p4_at_its_fleet() -> None:
    """At the bench's own fleet (4 workers for 2,000 connections) the line is P4's figure,
    rescaled from P4's 30-day month to the 730-hour month."""
    config = parse({})
    wru, rru = cost.dynamodb_units(config, 2000, model.workers_for(2000))
    results = json.loads(cost.BENCH_RESULTS.read_text())["designs"]["session"]["fleets"]["2000"]
    assert (wru, rru) == pytest.approx((results["wru_per_s"], results["rru_per_s"]))
    # Twice the heartbeat and checkpoint periods: half the per-worker writes.
    slower = parse({"heartbeatSeconds": "10", "leaseSeconds": "40", "checkpointSeconds": "10"})
    assert cost.dynamodb_units(slower, 2000, 4)[0] == pytest.approx(wru / 2)


def test_graviton_saves_a_fifth_of_fargate() -> None:
    config = parse({})
    x86, arm = cost.fargate_month(config, 3, "x86_64"), cost.fargate_month(config, 3, "arm64")
    assert 0.19 < 1 - arm / x86 < 0.21
    lines = cost.monthly_lines(parse({"cpuArchitecture": "arm64"}), 2000, cost.Workload())
    counted = [line for line in lines if line.service == "Fargate" and line.counted]
    assert [line.dollars for line in counted] == [pytest.approx(arm)]


def test_every_context_parameter_of_cost_reaches_a_line() -> None:
    base = cost.monthly_lines(parse({}), 2000, cost.Workload())
    for context in (
        {"stage": "prod"},
        {"natGateways": "2"},
        {"kinesisShards": "1"},
        {"kinesisRetentionHours": "168"},
        {"taskCpu": "1024", "taskMemoryMiB": "2048"},
        {"upstreamSecrets": "feeds/a"},
        {"sink": "null"},
    ):
        changed = cost.monthly_lines(parse(context), 2000, cost.Workload())
        assert cost.total(changed) != pytest.approx(cost.total(base)), context


def test_command_refuses_an_unknown_key_in_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "stacks.cost", "-c", "minTask=2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if not line.startswith("b'")]  # jsii's Node notice
    assert lines == [
        "invalid context minTask='2': unknown context key, did you mean `minTasks`? "
        "(every parameter: docs/infrastructure.md#context-parameters)"
    ]


def test_command_prints_the_table_with_prices_date_and_region() -> None:
    text = run_cost("-c", "stage=prod", "-c", "region=eu-west-1", "--connections", "2000")
    assert text.startswith(f"Leaseworker-prod, prices of {prices.PRICES_DATE} ({prices.PRICES_REGION})")
    assert "| **total** |" in text
    assert "Tasks: 3 at 2,000." in text
    assert "eu-west-1 is typically 0-30 % higher" in text
    assert "do not fit" in run_cost("--connections", "20000")


def test_docs_cost_tables_are_what_the_command_prints() -> None:
    text = DOC.read_text()
    blocks = MARKER.split(text)[1:]
    assert len(blocks) >= 3, "docs/cost.md lost its generated tables"
    for args, body in zip(blocks[::2], blocks[1::2], strict=True):
        printed = run_cost(*shlex.split(args))
        table = printed.split("\n\n", 1)[1].strip()
        assert body.startswith(table + "\n"), f"docs/cost.md is stale for ARGS={args!r}: rerun make cost"
