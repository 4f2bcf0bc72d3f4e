"""`connections apply -f FILE [--dry-run] [--prune]` end to end, against DynamoDB Local.

The installed `leaseworker` runs as a subprocess (as in test_cli.py). A bad file writes nothing;
a dry run writes nothing; a second apply changes nothing and says so; an update changes the feed
and leaves the lease and checkpoint alone; --prune removes only what is stopped and released.
"""

from __future__ import annotations

import asyncio
import json
from importlib import resources
from pathlib import Path
from typing import Any

import aioboto3
import jsonschema  # type: ignore[import-untyped]  # dev: via moto[server], no stubs
import pytest
import yaml

from leaseworker.cli.apply_file import load_desired
from leaseworker.cli.apply_plan import make_plan
from leaseworker.cli.apply_writes import Progress, write_changes
from leaseworker.lease.admin import LeaseTableAdmin
from tests.worker.integration.test_cli import bare_env, local_env, new_table, one_error_line, run, set_lease

__all__ = ["bare_env", "local_env"]  # the fixtures test_cli.py defines, used here by name

FEEDS = {
    "connections": [
        {"id": "feed-1", "url": "wss://feeds.example.com/feed-1"},
        {
            "id": "trades",
            "preset": "coinbase-exchange",
            "params": {"product_ids": ["BTC-USD", "ETH-USD"]},
            "state": "stopped",
        },
        {"id": "ha", "config": {"connect": {"url": "wss://ha.example.com/api/websocket"}}},
    ]
}


def write(path: Path, document: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return str(path)


def items(table: list[str], env: dict[str, str]) -> dict[str, dict[str, Any]]:
    done = run(*table, "connections", "list", "--json", env=env)
    assert done.returncode == 0, done.stderr
    return {str(item["connection_id"]): item for item in json.loads(done.stdout)}


def applied(table: list[str], env: dict[str, str], *args: str) -> list[str]:
    done = run(*table, "connections", "apply", *args, env=env)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stderr == ""  # no progress bar when stderr is not a terminal
    return done.stdout.splitlines()


def test_dry_run_then_apply_then_nothing(
    dynamodb_endpoint: str, local_env: dict[str, str], tmp_path: Path
) -> None:
    table = new_table(dynamodb_endpoint, local_env)
    path = write(tmp_path / "feeds.yaml", FEEDS)
    plan = [
        "+ feed-1  add seqfeed/1 wss://feeds.example.com/feed-1 (started)",
        "+ trades  add generic/1 [coinbase-exchange] wss://ws-feed.exchange.coinbase.com (stopped)",
        "+ ha  add generic/1 wss://ha.example.com/api/websocket (started)",
    ]
    assert applied(table, local_env, "-f", path, "--dry-run") == [
        *plan,
        "dry run: 3 to add, 0 unchanged; nothing written",
    ]
    assert items(table, local_env) == {}
    done = applied(table, local_env, "-f", path)
    assert done[:3] == plan and done[3].startswith(f"applied {path}: 3 added, 0 unchanged (")
    stored = items(table, local_env)
    assert {cid: item["desired_state"] for cid, item in stored.items()} == {
        "feed-1": "STARTED",
        "trades": "STOPPED",
        "ha": "STARTED",
    }
    assert stored["trades"]["preset"] == "coinbase-exchange"
    assert json.loads(stored["trades"]["protocol_config"])["open"][0]["send"]["product_ids"] == [
        "BTC-USD",
        "ETH-USD",
    ]
    assert applied(table, local_env, "-f", path) == [f"no changes: 3 connections match {path}"]
    assert applied(table, local_env, "-f", path, "--prune") == [f"no changes: 3 connections match {path}"]
    assert items(table, local_env) == stored  # not even updated_at_ms moved


def test_update_changes_the_feed_not_the_lease(
    dynamodb_endpoint: str, local_env: dict[str, str], tmp_path: Path
) -> None:
    table = new_table(dynamodb_endpoint, local_env)
    applied(table, local_env, "-f", write(tmp_path / "v1.yaml", FEEDS))
    set_lease(dynamodb_endpoint, table, "ha", lease_owner="w1", lease_epoch=4, last_seq=17)
    set_lease(dynamodb_endpoint, table, "feed-1", last_error="failed: gone")
    v2 = json.loads(json.dumps(FEEDS))
    v2["connections"][2]["config"]["connect"]["headers"] = {"Authorization": "Bearer {{secret:ha#token}}"}
    v2["connections"][0]["state"] = "stopped"
    v2["connections"][1]["state"] = "started"
    path = write(tmp_path / "v2.yaml", v2)
    assert applied(table, local_env, "-f", path)[:3] == [
        "~ feed-1  stop",
        "~ trades  start",
        "~ ha  update config",
    ]
    stored = items(table, local_env)
    ha = stored["ha"]
    assert json.loads(ha["protocol_config"])["connect"]["headers"] == {
        "Authorization": "Bearer {{secret:ha#token}}"
    }
    assert (ha["lease_owner"], ha["lease_epoch"], ha["last_seq"]) == ("w1", 4, 17)
    assert stored["feed-1"]["desired_state"] == "STOPPED" and stored["feed-1"]["last_error"] == "failed: gone"
    assert stored["trades"]["desired_state"] == "STARTED"
    assert applied(table, local_env, "-f", path) == [f"no changes: 3 connections match {path}"]


def test_a_bad_file_writes_nothing(dynamodb_endpoint: str, local_env: dict[str, str], tmp_path: Path) -> None:
    table = new_table(dynamodb_endpoint, local_env)
    bad = {
        "connections": [
            {"id": "good", "url": "wss://feeds.example.com/good"},
            {"id": "insecure", "url": "ws://feeds.example.com/x"},
            {"id": "typo", "urll": "wss://feeds.example.com/x"},
            {"id": "good", "url": "wss://feeds.example.com/again"},
            {"id": "cfg", "config": {"connect": {"url": "wss://x.example.com"}, "frames": 3}},
            {"id": "p", "preset": "jetstream", "params": {"nope": "1"}},
            {"url": "wss://feeds.example.com/no-id"},
        ]
    }
    done = run(*table, "connections", "apply", "-f", write(tmp_path / "bad.yaml", bad), env=local_env)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        "error: connections[1] (insecure): url: ws:// to non-loopback host 'feeds.example.com' needs "
        "ALLOW_INSECURE_WS=true: use wss://",
        "error: connections[2] (typo): urll: unknown field (did you mean 'url'?)",
        "error: connections[3] (good): id: also given at connections[0]",
        "error: connections[4] (cfg): config: frames: must be an object, not a number",
        "error: connections[5] (p): params: preset 'jetstream' has no parameter 'nope'; it takes: "
        "collections, dids, url",
        "error: connections[6]: id: required: a connection id, [A-Za-z0-9._:-]{1,128}",
        f"error: {tmp_path / 'bad.yaml'}: 6 invalid entries: nothing was written",
    ]
    assert items(table, local_env) == {}
    line = one_error_line(
        run(*table, "connections", "apply", "-f", str(tmp_path / "none.yaml"), env=local_env), 2
    )
    assert line.startswith("error: cannot read -f ")


def test_prune_removes_only_what_is_stopped_and_released(
    dynamodb_endpoint: str, local_env: dict[str, str], tmp_path: Path
) -> None:
    table = new_table(dynamodb_endpoint, local_env)
    for cid in ("keep", "old", "held"):
        assert (
            run(
                *table, "connections", "add", cid, "--url", f"wss://x.example.com/{cid}", env=local_env
            ).returncode
            == 0
        )
    # "held" is owned by a live connection-mode lease: its owner has not released it.
    set_lease(dynamodb_endpoint, table, "held", lease_owner="w1", lease_epoch=3, lease_expires_at_ms=2**52)
    path = write(tmp_path / "keep.yaml", {"connections": [{"id": "keep", "url": "wss://x.example.com/keep"}]})
    assert applied(table, local_env, "-f", path, "--dry-run") == [f"no changes: 1 connection matches {path}"]
    assert applied(table, local_env, "-f", path, "--prune", "--dry-run") == [
        "- held  remove (not in the file; stop it first)",
        "- old  remove (not in the file; stop it first)",
        "dry run: 2 to remove, 1 unchanged; nothing written",
    ]
    done = run(*table, "connections", "apply", "-f", path, "--prune", "--wait", "1", env=local_env)
    assert done.returncode == 1, (done.stdout, done.stderr)
    errors = done.stderr.splitlines()
    assert errors[0].startswith("error: held: not removed: it is STOPPED but still held by w1 (epoch 3; ")
    assert errors[0].endswith("it stays STOPPED: apply --prune again once it is released")
    assert errors[1] == "error: 1 of 2 changes not applied; the others were: fix the cause and apply again"
    stored = items(table, local_env)
    assert set(stored) == {"keep", "held"}
    assert stored["held"]["desired_state"] == "STOPPED" and stored["held"]["lease_owner"] == "w1"

    asyncio.run(_release(dynamodb_endpoint, table[-1], "held"))  # what its owner's release does
    assert applied(table, local_env, "-f", path, "--prune")[0] == "- held  remove (not in the file)"
    assert set(items(table, local_env)) == {"keep"}
    assert applied(table, local_env, "-f", path, "--prune") == [f"no changes: 1 connection matches {path}"]


async def _release(endpoint: str, table: str, cid: str) -> None:
    async with aioboto3.Session().client(
        "dynamodb", endpoint_url=endpoint, region_name="us-east-1"
    ) as client:
        await client.update_item(
            TableName=table,
            Key={"connection_id": {"S": cid}},
            UpdateExpression="SET lease_expires_at_ms = :zero REMOVE lease_owner",
            ExpressionAttributeValues={":zero": {"N": "0"}},
        )


def test_a_cancelled_transaction_is_written_one_by_one(
    dynamodb_endpoint: str, local_env: dict[str, str], tmp_path: Path
) -> None:
    """An add whose item appeared after the table was read cancels its transaction; the other
    changes of that transaction still land, and only the add is reported."""
    table = new_table(dynamodb_endpoint, local_env)
    entries = [{"id": f"f-{i:03d}", "url": f"wss://x.example.com/{i}"} for i in range(150)]
    desired = load_desired(write(tmp_path / "many.yaml", {"connections": entries}), {})
    plan = make_plan(desired, [], prune=False)  # planned against an empty table
    url = "wss://someone-else.example.com/f-007"
    assert run(*table, "connections", "add", "f-007", "--url", url, env=local_env).returncode == 0

    async def apply() -> list[str]:
        async with aioboto3.Session().client(
            "dynamodb", endpoint_url=dynamodb_endpoint, region_name="us-east-1"
        ) as client:
            admin = LeaseTableAdmin(client, table[-1])
            with Progress(None, len(plan.changes)) as progress:
                failures = await write_changes(admin, plan.changes, 4, progress)
            return [failure.line for failure in failures]

    assert asyncio.run(apply()) == [
        "f-007: add failed: connection 'f-007' was added by someone else since the table was read: "
        "apply again"
    ]
    stored = items(table, local_env)
    assert len(stored) == 150 and stored["f-007"]["ws_url"] == url
    assert stored["f-149"]["ws_url"] == "wss://x.example.com/149"


def test_the_schema_agrees_with_the_validator(tmp_path: Path) -> None:
    schema = json.loads(
        resources.files("leaseworker.cli").joinpath("connections-apply.schema.json").read_text("utf-8")
    )
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    validator.validate(FEEDS)
    assert len(load_desired(write(tmp_path / "ok.yaml", FEEDS), {})) == 3
    for entry in (
        {"id": "a", "urll": "wss://x.example.com"},
        {"id": "a", "url": "wss://x.example.com", "preset": "jetstream"},
        {"id": "a", "url": "wss://x.example.com", "params": {"k": "v"}},
        {"id": "a b", "url": "wss://x.example.com"},
        {"id": "a", "url": "wss://x.example.com", "state": "paused"},
        {"url": "wss://x.example.com"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            validator.validate({"connections": [entry]})


def test_ws_to_a_remote_host_needs_allow_insecure_ws(
    dynamodb_endpoint: str, local_env: dict[str, str], tmp_path: Path
) -> None:
    """The worker's rule (worker/backoff.py check_upstream_url) on every path: --url, --config,
    --preset url=, and each kind of apply entry; loopback is always allowed."""
    table = new_table(dynamodb_endpoint, local_env)
    remote = "ws://feeds.example.com/x"
    document = {
        "connections": [
            {"id": "u", "url": remote},
            {"id": "p", "preset": "jetstream", "params": {"url": remote}},
            {"id": "c", "config": {"connect": {"url": remote}}},
            {"id": "local", "url": "ws://127.0.0.1:9000/x"},
        ]
    }
    path = write(tmp_path / "insecure.yaml", document)
    done = run(*table, "connections", "apply", "-f", path, env=local_env)
    rule = "ws:// to non-loopback host 'feeds.example.com' needs ALLOW_INSECURE_WS=true: use wss://"
    assert done.returncode == 2 and done.stderr.splitlines() == [
        f"error: connections[0] (u): url: {rule}",
        f"error: connections[1] (p): preset 'jetstream': connect.url: {rule}",
        f"error: connections[2] (c): config: connect.url: {rule}",
        f"error: {path}: 3 invalid entries: nothing was written",
    ]
    preset = run(
        *table, "connections", "add", "p", "--preset", "jetstream", "--param", f"url={remote}", env=local_env
    )
    assert one_error_line(preset, 2) == f"error: connect.url: {rule}"
    assert items(table, local_env) == {}
    allowed = {**local_env, "ALLOW_INSECURE_WS": "true"}
    assert applied(table, allowed, "-f", path)[-1].startswith(f"applied {path}: 4 added")
