"""The supervisor's confirmed fence on DynamoDB Local and moto SQS (docs/design.md §2e).

A controllable child stands in for the worker: it does nothing but wait, so what is checked is
the supervisor alone. Kill the child and the session item must carry a confirmed fence, its
connections must be hinted and the supervisor must exit 128 + 9; pause it and nothing may
happen; SIGTERM the supervisor and a child that exits 0 must leave no trace.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import botocore.session
import pytest

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.vocabulary import INDEX_BY_OWNER
from leaseworker.supervisor.process import child_pids
from leaseworker_dev.local.services import LOCAL_CREDENTIALS, local_dynamodb
from tests.system.procscan import MARKER_VAR

# A cold start's slow import, in the worker child only: aioboto3 takes 2 s more to import, and a
# file says the child has reached it (it imports it after the CLI, with the worker's stack).
SLOW_IMPORT = """
import importlib.abc, os, sys, time

class SlowImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "aioboto3" and "--child" in sys.argv:
            open(os.environ["SLOW_IMPORT_MARKER"], "w").close()
            time.sleep(2.0)
        return None

sys.meta_path.insert(0, SlowImport())
"""
CHILD = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(int(os.environ.get("EXIT_ON_TERM", "0"))))
print(os.getpid(), flush=True)
while True:
    time.sleep(0.05)
"""
OWNED = ["feed-a", "feed-b", "feed-c"]


def sync_client(service: str, endpoint: str) -> Any:
    return botocore.session.get_session().create_client(
        service,
        endpoint_url=endpoint,
        region_name=LOCAL_CREDENTIALS["AWS_REGION"],
        aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )


async def create_table(endpoint: str, name: str) -> None:
    async with local_dynamodb(endpoint) as client:
        assert await LeaseTableAdmin(client, name).create_table()


def ensure_by_owner_index(ddb: Any, table: str) -> None:
    """The table admin gains `by-owner` on another branch; add it here until it does."""
    indexes = ddb.describe_table(TableName=table)["Table"].get("GlobalSecondaryIndexes", [])
    if any(index["IndexName"] == INDEX_BY_OWNER for index in indexes):
        return
    ddb.update_table(
        TableName=table,
        AttributeDefinitions=[{"AttributeName": "lease_owner", "AttributeType": "S"}],
        GlobalSecondaryIndexUpdates=[
            {
                "Create": {
                    "IndexName": INDEX_BY_OWNER,
                    "KeySchema": [{"AttributeName": "lease_owner", "KeyType": "HASH"}],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                }
            }
        ],
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        indexes = ddb.describe_table(TableName=table)["Table"].get("GlobalSecondaryIndexes", [])
        if all(index.get("IndexStatus") == "ACTIVE" for index in indexes):
            return
        time.sleep(0.2)
    raise AssertionError("the by-owner index never became ACTIVE")


@dataclass
class World:
    ddb: Any
    sqs: Any
    table: str
    queue_url: str
    worker_id: str
    env: dict[str, str]
    tmp_path: Path

    def session_item(self, suffix: str = "") -> dict[str, Any]:
        key = {"connection_id": {"S": f"worker#{self.worker_id}{suffix}"}}
        item: dict[str, Any] = self.ddb.get_item(TableName=self.table, Key=key, ConsistentRead=True)["Item"]
        return item

    def hints(self, wait_seconds: int = 1) -> list[str]:
        found: list[str] = []
        while True:
            response = self.sqs.receive_message(
                QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=wait_seconds
            )
            messages = response.get("Messages", [])
            if not messages:
                return found
            found += [m["Body"] for m in messages]

    def supervise(self, *, preload: bool = False, **env: str) -> tuple[subprocess.Popen[str], int]:
        script = self.tmp_path / "child.py"
        script.write_text(CHILD)
        options = ["--preload-clients"] if preload else []
        popen = subprocess.Popen(
            [sys.executable, "-m", "leaseworker.supervisor", *options, "--", sys.executable, str(script)],
            env={**self.env, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert popen.stdout is not None
        child = int(popen.stdout.readline())
        return popen, child


@pytest.fixture
def world(dynamodb_endpoint: str, moto_endpoint: str, tmp_path: Path, marker: str) -> Iterator[World]:
    table = f"sup-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_table(dynamodb_endpoint, table))
    ddb = sync_client("dynamodb", dynamodb_endpoint)
    ensure_by_owner_index(ddb, table)
    sqs = sync_client("sqs", moto_endpoint)
    queue_url = sqs.create_queue(QueueName=f"hints-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    worker_id = f"sup-{uuid.uuid4().hex[:6]}"
    now = str(int(time.time() * 1000))
    session = {"desired_state": {"S": "WORKER"}, "lease_expires_at_ms": {"N": "0"}, "hb": {"N": "7"}}
    for key, attributes in ((f"worker#{worker_id}", session), (f"worker#{worker_id}#ckpt", {})):
        ddb.put_item(
            TableName=table, Item={"connection_id": {"S": key}, "updated_at_ms": {"N": now}, **attributes}
        )
    for cid, owner in [*((cid, worker_id) for cid in OWNED), ("feed-other", "someone-else")]:
        ddb.put_item(
            TableName=table,
            Item={
                "connection_id": {"S": cid},
                "desired_state": {"S": "STARTED"},
                "lease_owner": {"S": owner},
                "lease_epoch": {"N": "4"},
                "lease_expires_at_ms": {"N": str(2**53 - 1)},
                "last_seq": {"N": "-1"},
            },
        )
    env = {
        **os.environ,
        **LOCAL_CREDENTIALS,
        MARKER_VAR: marker,
        "WORKER_ID": worker_id,
        "TABLE_NAME": table,
        "AWS_ENDPOINT_URL_DYNAMODB": dynamodb_endpoint,
        "AWS_ENDPOINT_URL_SQS": moto_endpoint,
        "NOTIFY_QUEUE_URL": queue_url,
    }
    yield World(ddb, sqs, table, queue_url, worker_id, env, tmp_path)
    ddb.delete_table(TableName=table)
    sqs.delete_queue(QueueUrl=queue_url)


def finish(popen: subprocess.Popen[str], timeout: float = 30) -> tuple[int, str]:
    _, stderr = popen.communicate(timeout=timeout)
    return popen.returncode, stderr


@pytest.mark.parametrize("preload", [False, True], ids=["lazy-clients", "preloaded-clients"])
def test_a_killed_child_is_fenced_as_confirmed_and_its_connections_hinted(
    world: World, preload: bool
) -> None:
    popen, child = world.supervise(preload=preload)
    if preload:
        time.sleep(3)  # let the clients load before the death (the point of preloading)
    killed_at_ms = int(time.time() * 1000)
    os.kill(child, signal.SIGKILL)
    status, stderr = finish(popen)
    assert status == 137, stderr

    session = world.session_item()
    assert session["fence_kind"] == {"S": "confirmed"}
    assert session["fenced_by"] == {"S": f"supervisor:{world.worker_id}"}
    assert "killed by SIGKILL" in session["fence_reason"]["S"]
    assert session["hb"] == {"N": "7"}  # nothing else touched
    assert world.session_item("#ckpt")["fence_kind"] == {"S": "confirmed"}
    hinted = sorted({json.loads(body)["connection_id"] for body in world.hints()})
    assert hinted == OWNED  # and not feed-other, which someone else holds
    log = json.loads(stderr.strip().splitlines()[-1])
    assert log["session"] == "fenced" and log["hinted"] == 3 and log["finished"], log
    fenced_after_ms = int(session["fenced_at_ms"]["N"]) - killed_at_ms
    print(f"\npreload={preload} kill->fence write {fenced_after_ms} ms; steps {log['elapsed_ms']}")


def test_a_fence_already_there_is_left_alone(world: World) -> None:
    world.ddb.update_item(
        TableName=world.table,
        Key={"connection_id": {"S": f"worker#{world.worker_id}"}},
        UpdateExpression="SET fenced_by = :o, fence_kind = :k",
        ExpressionAttributeValues={":o": {"S": "observer-1"}, ":k": {"S": "suspected"}},
    )
    popen, child = world.supervise()
    os.kill(child, signal.SIGKILL)
    status, stderr = finish(popen)
    assert status == 137, stderr
    session = world.session_item()
    assert session["fenced_by"] == {"S": "observer-1"}
    assert session["fence_kind"] == {"S": "suspected"}
    assert {json.loads(body)["connection_id"] for body in world.hints()} == set(OWNED)  # still useful


def test_a_paused_child_is_never_fenced(world: World) -> None:
    popen, child = world.supervise()
    os.kill(child, signal.SIGSTOP)
    time.sleep(3)  # well past the time a fence takes after a real death
    assert popen.poll() is None
    assert "fenced_by" not in world.session_item()
    os.kill(child, signal.SIGCONT)
    popen.send_signal(signal.SIGTERM)
    status, stderr = finish(popen)
    assert status == 0, stderr
    assert "fenced_by" not in world.session_item()
    assert world.hints() == []


def test_sigterm_is_forwarded_and_a_clean_exit_leaves_no_trace(world: World) -> None:
    popen, _ = world.supervise()
    popen.send_signal(signal.SIGTERM)
    status, stderr = finish(popen)
    assert status == 0, stderr
    assert "fenced_by" not in world.session_item()
    assert "fenced_by" not in world.session_item("#ckpt")
    assert world.hints() == []


def test_a_child_that_exits_non_zero_after_sigterm_is_fenced(world: World) -> None:
    popen, _ = world.supervise(EXIT_ON_TERM="3")
    popen.send_signal(signal.SIGTERM)
    status, stderr = finish(popen)
    assert status == 3, stderr
    assert world.session_item()["fence_kind"] == {"S": "confirmed"}
    assert "exited with status 3" in world.session_item()["fence_reason"]["S"]


# ------------------------------------------------------------------ with the real worker


@dataclass
class RealWorker:
    popen: subprocess.Popen[str]
    worker_id: str

    def child(self) -> int:
        children = child_pids(self.popen.pid)
        assert len(children) == 1, children
        return children[0]


@pytest.fixture
def feed_url(tmp_path: Path, marker: str) -> Iterator[str]:
    feed = subprocess.Popen(
        [sys.executable, "-m", "leaseworker_dev.feed", "--port", "0", "--rate", "20"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, MARKER_VAR: marker},
    )
    assert feed.stdout is not None
    yield str(json.loads(feed.stdout.readline())["feed"])
    feed.send_signal(signal.SIGTERM)
    feed.wait(30)


def owned_by(world: World, worker_id: str) -> list[str]:
    items = world.ddb.scan(TableName=world.table, ConsistentRead=True)["Items"]
    return sorted(i["connection_id"]["S"] for i in items if i.get("lease_owner", {}).get("S") == worker_id)


def start_real_worker(world: World, worker_id: str, endpoint: str, **extra_env: str) -> RealWorker:
    env = {
        **world.env,
        **extra_env,
        "LEASE_SECONDS": "3",
        "HEARTBEAT_SECONDS": "1",
        "RECONCILE_SECONDS": "1",
        "MAX_CLOCK_SKEW_MS": "200",
        "SHUTDOWN_GRACE_SECONDS": "10",
        "SINK": "null",
        "LOG_LEVEL": "WARNING",
    }
    del env["WORKER_ID"]  # `leaseworker run` decides it, from --worker-id here
    argv = [sys.executable, "-m", "leaseworker", "--table", world.table, "--endpoint-url", endpoint]
    popen = subprocess.Popen(
        [*argv, "run", "--worker-id", worker_id],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    return RealWorker(popen, worker_id)


def wait_for(predicate: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_leaseworker_run_supervises_the_real_worker(
    world: World, feed_url: str, dynamodb_endpoint: str
) -> None:
    """`leaseworker run` end to end: SIGTERM gives the graceful exit 0 and no fence; SIGKILL of the
    worker child gives a confirmed fence on its session item and a hint per connection it held."""
    real = ["real-a", "real-b", "real-c"]

    async def add() -> None:
        async with local_dynamodb(dynamodb_endpoint) as client:
            admin = LeaseTableAdmin(client, world.table)
            for cid in real:
                await admin.add(cid, f"{feed_url}/{cid}")

    for cid in [*OWNED, "feed-other"]:  # the fixture's stand-ins: not this test's business
        world.ddb.delete_item(TableName=world.table, Key={"connection_id": {"S": cid}})
    asyncio.run(add())

    graceful = start_real_worker(world, "real-term", dynamodb_endpoint)
    wait_for(lambda: owned_by(world, "real-term") == real, "the worker to own every connection")
    graceful.popen.send_signal(signal.SIGTERM)
    status, stderr = finish(graceful.popen, timeout=15)
    assert status == 0, stderr
    assert owned_by(world, "real-term") == []  # released, not left to expire
    key = {"connection_id": {"S": "worker#real-term"}}
    item = world.ddb.get_item(TableName=world.table, Key=key).get("Item", {})
    # A clean exit fences its own session as confirmed (peers may reap it); never the supervisor.
    assert item.get("fenced_by", {}).get("S") == "real-term", item
    assert item.get("fence_reason", {}).get("S") == "exited after its ordered shutdown", item
    world.hints()  # drain the release notifications

    crashing = start_real_worker(world, "real-kill", dynamodb_endpoint)
    wait_for(lambda: owned_by(world, "real-kill") == real, "the worker to own every connection")
    key = {"connection_id": {"S": "worker#real-kill"}}
    wait_for(lambda: "Item" in world.ddb.get_item(TableName=world.table, Key=key), "its first heartbeat")
    os.kill(crashing.child(), signal.SIGKILL)
    status, stderr = finish(crashing.popen)
    assert status == 137, stderr
    session = world.ddb.get_item(TableName=world.table, Key=key, ConsistentRead=True)["Item"]
    assert session["fence_kind"] == {"S": "confirmed"}
    assert session["fenced_by"] == {"S": "supervisor:real-kill"}
    # The dead child's own long poll may have taken the first round: the repeat must get through.
    assert sorted({json.loads(body)["connection_id"] for body in world.hints()}) == real


def test_sigterm_while_the_worker_child_is_still_importing_is_a_clean_stop(
    world: World, dynamodb_endpoint: str, tmp_path: Path
) -> None:
    """ECS may stop a task that has only just started. A SIGTERM while the worker child still
    imports its stack met Python's default action: the child died of it, and the supervisor took
    that for a crash (exit 143, a fence). It is a stop: exit 0, no session written, no fence."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_IMPORT)
    importing = tmp_path / "importing"
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    worker = start_real_worker(
        world, "real-early", dynamodb_endpoint, PYTHONPATH=path, SLOW_IMPORT_MARKER=str(importing)
    )
    wait_for(importing.exists, "the worker child to import aioboto3")
    worker.popen.send_signal(signal.SIGTERM)
    status, stderr = finish(worker.popen)
    assert status == 0, stderr
    assert "Traceback" not in stderr, stderr
    key = {"connection_id": {"S": "worker#real-early"}}
    assert "Item" not in world.ddb.get_item(TableName=world.table, Key=key, ConsistentRead=True)
