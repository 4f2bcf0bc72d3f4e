"""The operator CLI end to end, as a subprocess: each expected failure is one line, never a traceback.

Failures are asserted on the exit code (1: the operation failed, 2: the input was invalid), on
stderr being exactly one line that starts with "error:", and on the time it took where an
unreachable endpoint could otherwise hang in SDK retries.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aioboto3
import pytest

from leaseworker.lease.checkpoint_store import CheckpointStore
from leaseworker.lease.held_store import SessionHeldStore
from leaseworker.lease.results import Acquired
from leaseworker.lease.session_store import SessionStore
from leaseworker.settings import Settings
from leaseworker_dev.local.services import free_port

LEASEWORKER = Path(sys.executable).with_name("leaseworker")


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LEASEWORKER), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def one_error_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def run_all(commands: list[list[str]], env: dict[str, str]) -> list[subprocess.CompletedProcess[str]]:
    """Several invocations at once (each one mostly waits on imports)."""
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        return list(pool.map(lambda args: run(*args, env=env), commands))


@pytest.fixture(scope="module")
def bare_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """No AWS_* variables and an empty HOME: no config file, no credentials, no region."""
    home = tmp_path_factory.mktemp("home")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TABLE_NAME", "NOTIFY_"))}
    env.update({"HOME": str(home), "AWS_EC2_METADATA_DISABLED": "true"})
    return env


@pytest.fixture(scope="module")
def local_env(bare_env: dict[str, str]) -> dict[str, str]:
    return {
        **bare_env,
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "local",
        "AWS_SECRET_ACCESS_KEY": "local",
    }


def new_table(endpoint: str, env: dict[str, str]) -> list[str]:
    """Global options selecting a fresh table on DynamoDB Local, created with the CLI."""
    name = f"cli-{uuid.uuid4().hex[:8]}"
    target = ["--endpoint-url", endpoint, "--table", name]
    done = run(*target, "table", "create", env=env)
    assert done.returncode == 0, done.stderr
    assert f"table {name} created" in done.stdout
    return target


@pytest.fixture(scope="module")
def table(dynamodb_endpoint: str, local_env: dict[str, str]) -> list[str]:
    """A table shared by the failure tests (they never change it)."""
    return new_table(dynamodb_endpoint, local_env)


def test_help_reads_well() -> None:
    done = run("--help")
    assert done.returncode == 0
    for text in ("local up", "connections add", "--table", "--endpoint-url", "TableName output"):
        assert text in done.stdout, text
    for command in ("connections", "local", "run", "table"):
        assert f"  {command} " in done.stdout, command
    local_help = run("local", "up", "--help").stdout
    for text in ("k kill", "--scenario", "--duration", "--no-auto-faults", "[default: 3", "[default: 12"):
        assert text in local_help, text


def test_no_region(bare_env: dict[str, str]) -> None:
    line = one_error_line(run("connections", "list", env=bare_env), 1)
    assert "no AWS region" in line and "AWS_REGION" in line


def test_no_credentials(bare_env: dict[str, str]) -> None:
    line = one_error_line(run("connections", "list", env={**bare_env, "AWS_REGION": "us-east-1"}), 1)
    assert "no AWS credentials" in line


def test_unreachable_endpoint_fails_fast(local_env: dict[str, str]) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    done = run("--endpoint-url", endpoint, "connections", "list", env=local_env)
    elapsed = time.monotonic() - started
    line = one_error_line(done, 1)
    assert f"cannot reach DynamoDB at {endpoint}" in line
    assert elapsed < 8, f"took {elapsed:.1f} s"


def test_bad_endpoint_url(local_env: dict[str, str]) -> None:
    line = one_error_line(run("--endpoint-url", "not-a-url", "connections", "list", env=local_env), 2)
    assert "invalid --endpoint-url 'not-a-url'" in line


def test_no_table(dynamodb_endpoint: str, local_env: dict[str, str]) -> None:
    done = run(
        "--endpoint-url", dynamodb_endpoint, "--table", "no-such-table", "connections", "list", env=local_env
    )
    line = one_error_line(done, 1)
    assert "table 'no-such-table' does not exist" in line and "leaseworker table create" in line


def test_options_typed_before_the_subcommand_win_over_the_environment(
    dynamodb_endpoint: str, local_env: dict[str, str]
) -> None:
    """docs/design.md §6: `--table` / TABLE_NAME and `--endpoint-url` / AWS_ENDPOINT_URL: what is
    typed wins, before the subcommand too (the form the help and README show)."""
    elsewhere = {
        **local_env,
        "TABLE_NAME": "not-this-table",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",  # nothing listens there
    }
    table = new_table(dynamodb_endpoint, local_env)
    done = run(*table, "connections", "list", "--json", env=elsewhere)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    after = run("connections", "list", "--json", *table, env=elsewhere)
    assert after.returncode == 0, after.stderr


def test_unknown_connection(table: list[str], local_env: dict[str, str]) -> None:
    verbs = ["show", "stop", "start", "remove"]
    for verb, done in zip(
        verbs, run_all([[*table, "connections", v, "nope"] for v in verbs], local_env), strict=True
    ):
        line = one_error_line(done, 1)
        assert "no connection 'nope'" in line, verb


def test_invalid_connection_id(table: list[str], local_env: dict[str, str]) -> None:
    verbs = ["show", "stop", "remove"]
    commands = [[*table, "connections", v, "has space"] for v in verbs]
    for verb, done in zip(verbs, run_all(commands, local_env), strict=True):
        line = one_error_line(done, 2)
        assert "invalid connection id 'has space'" in line, verb


def test_bad_url_and_duplicate(table: list[str], local_env: dict[str, str]) -> None:
    line = one_error_line(run(*table, "connections", "add", "dup-1", "--url", "http://x", env=local_env), 2)
    assert "invalid url 'http://x'" in line
    assert (
        run(*table, "connections", "add", "dup-1", "--url", "ws://127.0.0.1:9/f", env=local_env).returncode
        == 0
    )
    line = one_error_line(
        run(*table, "connections", "add", "dup-1", "--url", "ws://127.0.0.1:9/f", env=local_env), 2
    )
    assert "already exists" in line


def test_list_and_show(dynamodb_endpoint: str, local_env: dict[str, str]) -> None:
    table = new_table(dynamodb_endpoint, local_env)
    empty = run(*table, "connections", "list", env=local_env)
    assert empty.returncode == 0 and "no connections in" in empty.stdout
    for cid in ("feed-a", "feed-b"):
        added = run(
            *table, "connections", "add", cid, "--url", f"wss://feeds.example.com/{cid}", env=local_env
        )
        assert added.returncode == 0 and f"added {cid}" in added.stdout
    assert run(*table, "connections", "stop", "feed-b", env=local_env).returncode == 0

    listed = run(*table, "connections", "list", env={**local_env, "COLUMNS": "160"})
    assert listed.returncode == 0, listed.stderr
    assert "2 connections in" in listed.stdout
    for header in ("connection", "state", "owner", "epoch", "lease", "updated", "checkpoint", "last_error"):
        assert header in listed.stdout
    assert "STOPPED" in listed.stdout and "STARTED" in listed.stdout and "free" in listed.stdout

    items = json.loads(run(*table, "connections", "list", "--json", env=local_env).stdout)
    assert [item["connection_id"] for item in items] == ["feed-a", "feed-b"]
    for key in ("desired_state", "ws_url", "last_seq", "lease_owner", "lease_epoch", "lease_expires_at_ms"):
        assert key in items[0], key  # docs/design.md §6, null when unset
    assert items[0]["lease_owner"] is None  # free
    assert items[0]["last_seq"] == -1 and items[1]["desired_state"] == "STOPPED"

    shown = run(*table, "connections", "show", "feed-a", env=local_env)
    assert shown.returncode == 0
    assert "ws_url" in shown.stdout and "wss://feeds.example.com/feed-a" in shown.stdout
    assert "lease" in shown.stdout and "free" in shown.stdout
    item = json.loads(run(*table, "connections", "show", "feed-a", "--json", env=local_env).stdout)
    assert item["connection_id"] == "feed-a" and item["lease_epoch"] == 0 and item["checkpoint"] == -1


def test_list_and_show_report_the_effective_checkpoint(
    dynamodb_endpoint: str, local_env: dict[str, str]
) -> None:
    """Session mode checkpoints into the holder's batched item, not the connection item: the CLI
    reports the newer of the two at the item's epoch (what a takeover resumes after)."""
    table = new_table(dynamodb_endpoint, local_env)
    name = table[-1]
    for cid in ("held", "stale"):
        url = f"wss://feeds.example.com/{cid}"
        assert run(*table, "connections", "add", cid, "--url", url, env=local_env).returncode == 0
    asyncio.run(hold_with_checkpoints(dynamodb_endpoint, name))

    listed_json = run(*table, "connections", "list", "--json", env=local_env).stdout
    items = {item["connection_id"]: item for item in json.loads(listed_json)}
    # §6's `last_seq` is the effective checkpoint; the item's own stays in `item_last_seq`.
    assert items["held"]["last_seq"] == items["held"]["checkpoint"] == 41
    assert items["held"]["item_last_seq"] == -1
    assert items["stale"]["checkpoint"] == -1  # its entry was written under another epoch
    shown = json.loads(run(*table, "connections", "show", "held", "--json", env=local_env).stdout)
    assert shown["checkpoint"] == 41 and shown["lease_owner"] == "w9"
    listed = run(*table, "connections", "list", env={**local_env, "COLUMNS": "200"})
    assert "held by its session" in listed.stdout and " 41 " in listed.stdout, listed.stdout
    text = run(*table, "connections", "show", "held", env=local_env).stdout
    expiry_line = text.split("lease_expires_at_ms")[1].splitlines()[0]
    assert "held by its session" in text and "s from now" not in expiry_line


async def hold_with_checkpoints(endpoint: str, table: str) -> None:
    """Worker w9 claims both in session mode and writes one batched checkpoint item."""
    settings = Settings(table_name=table, worker_id="w9", endpoint_url=endpoint, region="us-east-1")
    session = aioboto3.Session(aws_access_key_id="local", aws_secret_access_key="local")
    async with session.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1") as client:
        held = SessionHeldStore(client, settings)
        for cid in ("held", "stale"):
            assert isinstance(await held.claim_free(cid, "w9", valid_until=time.monotonic() + 60), Acquired)
        assert await CheckpointStore(client, table).write("w9", {"held": (1, 41), "stale": (7, 99)})


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("LEASE_MODE", "zookeeper", "invalid LEASE_MODE='zookeeper': must be one of connection, session"),
        ("LEASE_SECONDS", "abc", "invalid LEASE_SECONDS='abc': must be a number"),
        ("HEARTBEAT_SECONDS", "10", "invalid LEASE_SECONDS=20.0: must be >= 3 x HEARTBEAT_SECONDS (30)"),
        ("SINK", "s3:bucket", "invalid SINK='s3:bucket'"),
        ("SHUTDOWN_GRACE_SECONDS", "300", "invalid SHUTDOWN_GRACE_SECONDS=300.0: must be <= 120"),
        ("LEASE_SECONDS", "nan", "invalid LEASE_SECONDS='nan': must be a finite number, not NaN or infinity"),
        ("MAX_CONNECTIONS", "inf", "invalid MAX_CONNECTIONS='inf': must be a finite number, not NaN"),
        ("HEARTBEAT_SECONDS", "1e999", "invalid HEARTBEAT_SECONDS='1e999': must be a finite number"),
    ],
)
def test_run_refuses_bad_settings_in_one_line(
    local_env: dict[str, str], variable: str, value: str, says: str
) -> None:
    """The worker validates its settings before touching the network: one line, exit 2."""
    done = run("run", env={**local_env, variable: value})
    assert says in one_error_line(done, 2)


def set_lease(endpoint: str, table: list[str], cid: str, **values: str | int) -> None:
    """Give a connection a lease state directly (an owner, an epoch), as a worker would have."""
    names = list(values)

    async def update() -> None:
        async with aioboto3.Session().client(
            "dynamodb", endpoint_url=endpoint, region_name="us-east-1"
        ) as client:
            await client.update_item(
                TableName=table[-1],
                Key={"connection_id": {"S": cid}},
                UpdateExpression="SET " + ", ".join(f"#{i} = :{i}" for i in range(len(names))),
                ExpressionAttributeNames={f"#{i}": name for i, name in enumerate(names)},
                ExpressionAttributeValues={
                    f":{i}": {"N": str(value)} if isinstance(value, int) else {"S": value}
                    for i, value in enumerate(values.values())
                },
            )

    asyncio.run(update())


def live_session(endpoint: str, table: list[str], worker: str) -> None:
    """A session item for `worker`, as its first heartbeat writes it (live, not fenced)."""

    async def beat() -> None:
        async with aioboto3.Session().client(
            "dynamodb", endpoint_url=endpoint, region_name="us-east-1"
        ) as client:
            await SessionStore(client, table[-1]).heartbeat(worker, load=1, capacity=10, lease_mode="session")

    asyncio.run(beat())


def test_remove_needs_a_stopped_released_connection_and_keeps_its_epoch(
    dynamodb_endpoint: str, local_env: dict[str, str]
) -> None:
    table = new_table(dynamodb_endpoint, local_env)
    url = "wss://feeds.example.com/c1"
    assert run(*table, "connections", "add", "c1", "--url", url, env=local_env).returncode == 0
    set_lease(dynamodb_endpoint, table, "c1", lease_epoch=7)
    line = one_error_line(run(*table, "connections", "remove", "c1", env=local_env), 2)
    assert line == (
        "error: connection 'c1' is STARTED: stop it first (`leaseworker connections stop c1`), "
        "or pass --force to stop it, wait for the release and remove it"
    )
    assert run(*table, "connections", "stop", "c1", env=local_env).returncode == 0
    removed = run(*table, "connections", "remove", "c1", env=local_env)
    assert removed.returncode == 0 and removed.stdout.strip() == "removed c1", removed.stderr
    assert "no connection 'c1'" in one_error_line(run(*table, "connections", "show", "c1", env=local_env), 1)
    assert "no connection 'c1'" in one_error_line(run(*table, "connections", "start", "c1", env=local_env), 1)
    assert json.loads(run(*table, "connections", "list", "--json", env=local_env).stdout) == []
    assert run(*table, "connections", "add", "c1", "--url", url, env=local_env).returncode == 0
    item = json.loads(run(*table, "connections", "show", "c1", "--json", env=local_env).stdout)
    assert item["lease_epoch"] == 7 and item["desired_state"] == "STARTED" and item["last_seq"] == -1
    assert "removed_at_ms" not in item


def test_remove_refuses_a_stopped_connection_still_owned(
    dynamodb_endpoint: str, local_env: dict[str, str]
) -> None:
    table = new_table(dynamodb_endpoint, local_env)
    assert (
        run(*table, "connections", "add", "c1", "--url", "wss://x.example.com/f", env=local_env).returncode
        == 0
    )
    assert run(*table, "connections", "stop", "c1", env=local_env).returncode == 0
    expires = int(time.time() * 1000) + 60_000
    set_lease(dynamodb_endpoint, table, "c1", lease_owner="w1", lease_epoch=3, lease_expires_at_ms=expires)
    line = one_error_line(run(*table, "connections", "remove", "c1", env=local_env), 2)
    assert line.startswith(
        "error: connection 'c1' is STOPPED but still held by w1 (epoch 3; not renewed for "
    )
    assert line.endswith(
        "own clock): wait for its release, or pass --force to stop it, wait for the release and remove it"
    )


def test_remove_force(dynamodb_endpoint: str, local_env: dict[str, str]) -> None:
    table = new_table(dynamodb_endpoint, local_env)
    for cid in ("free", "held"):
        added = run(*table, "connections", "add", cid, "--url", "wss://x.example.com/f", env=local_env)
        assert added.returncode == 0
    done = run(*table, "connections", "remove", "free", "--force", env=local_env)
    assert done.returncode == 0 and done.stdout.strip() == "removed free" and done.stderr == ""

    # Held by a session that never lets go: --force stops it, reports progress, then gives up.
    set_lease(
        dynamodb_endpoint, table, "held", lease_owner="w1", lease_epoch=3, lease_expires_at_ms=2**53 - 1
    )
    live_session(dynamodb_endpoint, table, "w1")  # an absent session would not hold it (review D)
    done = run(*table, "connections", "remove", "held", "--force", "--wait", "1", env=local_env)
    assert done.returncode == 1, done
    progress, error = done.stderr.splitlines()
    assert progress.startswith(
        "waiting for the release: held is STOPPED but still held by the live session of w1"
    )
    assert error == (
        "error: connection 'held' is STOPPED but still held by the live session of w1 (epoch 3) after "
        "waiting 1 s; it stays STOPPED: run `leaseworker connections remove held --force` again once it "
        "is released"
    )
    item = json.loads(run(*table, "connections", "show", "held", "--json", env=local_env).stdout)
    assert item["desired_state"] == "STOPPED" and item["lease_owner"] == "w1"


@pytest.mark.parametrize("wait", ["nan", "inf", "0", "-1"])
def test_remove_force_wait_must_be_finite_and_positive(
    table: list[str], local_env: dict[str, str], wait: str
) -> None:
    line = one_error_line(
        run(*table, "connections", "remove", "x", "--force", "--wait", wait, env=local_env), 2
    )
    assert line.startswith(f"error: invalid --wait {float(wait)!r}: must be a finite number of seconds > 0")
