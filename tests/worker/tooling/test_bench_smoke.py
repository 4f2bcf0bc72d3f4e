"""The benchmark's code cannot rot: its pricing rules agree with DynamoDB Local, and a tiny run
produces results.json, the plots and the report. Nothing here times anything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bench.capacity import CrossCheck, write_units
from bench.fleet_run import SMOKE
from bench.plots import write_plots
from bench.report import write_report
from bench.run import _finite, run

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb import DynamoDBClient


def connection(cid: str, expires: int) -> dict[str, Any]:
    return {
        "connection_id": {"S": cid},
        "desired_state": {"S": "STARTED"},
        "lease_owner": {"S": "w1"},
        "lease_epoch": {"N": "3"},
        "lease_expires_at_ms": {"N": str(expires)},
        "last_seq": {"N": "10"},
    }


def update(table: str, cid: str, expression: str, values: dict[str, Any]) -> dict[str, Any]:
    return {
        "TableName": table,
        "Key": {"connection_id": {"S": cid}},
        "UpdateExpression": expression,
        "ConditionExpression": "lease_owner = :me",
        "ExpressionAttributeValues": values | {":me": {"S": "w1"}},
    }


async def test_rules_price_a_renewal_and_a_checkpoint_as_dynamodb_local_does(
    ddb: DynamoDBClient, table: str
) -> None:
    await ddb.put_item(TableName=table, Item=connection("c1", 1000))
    check = CrossCheck(ddb, table)
    renew = await check.price(
        "UpdateItem", update(table, "c1", "SET lease_expires_at_ms = :e", {":e": {"N": "2000"}})
    )
    checkpoint = await check.price(
        "UpdateItem", update(table, "c1", "SET last_seq = :s", {":s": {"N": "11"}})
    )
    assert (renew["rules"], renew["local"]) == (3.0, 3.0)
    assert renew["rules_indexes"] == renew["local_indexes"] == {"by-state-expiry": 2.0}
    assert renew["partitions"] == {"by-state-expiry": "STARTED"}
    assert (checkpoint["rules"], checkpoint["local"]) == (1.0, 1.0)


def test_an_item_over_one_kilobyte_costs_more_than_one_write_unit() -> None:
    big = connection("c1", 0) | {"pad": {"S": "x" * 2100}}
    assert write_units(None, big).table == 3
    assert write_units(big, connection("c1", 0)).table == 3  # the larger of before and after


@pytest.mark.system
def test_a_tiny_bench_run_produces_results_plots_and_report(tmp_path: Path) -> None:
    results = _finite(run(SMOKE, ["session"]))
    (tmp_path / "results.json").write_text(json.dumps(results))
    write_plots(results, tmp_path)
    write_report(results, tmp_path / "benchmarks.md", tmp_path)
    session = json.loads((tmp_path / "results.json").read_text())["designs"]["session"]
    assert {"measured", "fleets", "kinds", "takeover_kill", "handoff_term"} <= set(session)
    assert session["measured"]["wru_per_connection_hour"] > 0
    assert any(kind.startswith("UpdateItem session") for kind in session["kinds"])
    assert set(session["fleets"]) == {"100", "2000", "10000"}
    assert (tmp_path / "takeover.png").stat().st_size > 0 and (tmp_path / "units.png").stat().st_size > 0
    assert "## P3" in (tmp_path / "benchmarks.md").read_text()
