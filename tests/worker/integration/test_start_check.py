"""A worker whose lease table cannot work exits at start, in one line, with status 78.

`leaseworker run` (the supervisor and its worker child, as in the container) against DynamoDB
Local with a table that does not exist, against a table that is not a lease table (no GSIs), and
against a closed port. The supervisor passes the child's status on and fences nothing; the
closed port is retried for START_CHECK_SECONDS, no longer.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import aioboto3

from leaseworker.supervisor.process import EXIT_NOT_STARTED
from leaseworker.worker.start_check import START_CHECK_SECONDS
from leaseworker_dev.local.services import free_port
from tests.worker.integration.test_cli import bare_env, local_env, new_table, one_error_line, run

__all__ = ["bare_env", "local_env"]  # the fixtures test_cli.py defines, used here by name

# Start-up of two interpreters (supervisor, then the worker child importing its stack) on a
# loaded 2-core machine, on top of the check's own bound.
STARTUP_ALLOWANCE_SECONDS = 12.0


def run_worker(endpoint: str, table: str, env: dict[str, str]) -> tuple[str, float]:
    started = time.monotonic()
    done = run(
        "--endpoint-url",
        endpoint,
        "--table",
        table,
        "run",
        "--sink",
        "null",
        env={**env, "WORKER_ID": f"w-{uuid.uuid4().hex[:6]}"},
        timeout=60,
    )
    elapsed = time.monotonic() - started
    return one_error_line(done, EXIT_NOT_STARTED), elapsed


def test_missing_table_exits_at_once(dynamodb_endpoint: str, local_env: dict[str, str]) -> None:
    line, elapsed = run_worker(dynamodb_endpoint, "no-such-table", local_env)
    assert line == (
        f"error: table 'no-such-table' at {dynamodb_endpoint} does not exist: create it "
        "(`leaseworker table create`) or set TABLE_NAME to the stack's TableName output"
    )
    assert elapsed < STARTUP_ALLOWANCE_SECONDS, f"took {elapsed:.1f} s"


def test_a_table_without_the_lease_indexes_is_refused(
    dynamodb_endpoint: str, local_env: dict[str, str]
) -> None:
    name = f"plain-{uuid.uuid4().hex[:8]}"

    async def create() -> None:
        async with aioboto3.Session().client(
            "dynamodb", endpoint_url=dynamodb_endpoint, region_name="us-east-1"
        ) as client:
            await client.create_table(
                TableName=name,
                BillingMode="PAY_PER_REQUEST",
                AttributeDefinitions=[{"AttributeName": "connection_id", "AttributeType": "S"}],
                KeySchema=[{"AttributeName": "connection_id", "KeyType": "HASH"}],
            )

    asyncio.run(create())
    line, _ = run_worker(dynamodb_endpoint, name, local_env)
    assert line.startswith(f"error: cannot use table {name!r} at {dynamodb_endpoint}: a Query of index ")
    assert "was refused: ValidationException" in line


def test_closed_port_exits_within_the_bound(local_env: dict[str, str]) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    line, elapsed = run_worker(endpoint, "t", local_env)
    assert line.startswith(
        f"error: cannot use table 't' at {endpoint}: no answer within {START_CHECK_SECONDS:g} s ("
    )
    assert "Could not connect to the endpoint URL" in line
    assert START_CHECK_SECONDS <= elapsed < START_CHECK_SECONDS + STARTUP_ALLOWANCE_SECONDS, elapsed


def test_a_lease_table_starts(dynamodb_endpoint: str, local_env: dict[str, str]) -> None:
    """The control: a table made by `table create` passes the check (the worker then runs)."""
    from leaseworker.settings import load_settings
    from leaseworker.worker.start_check import check_lease_table

    table = new_table(dynamodb_endpoint, local_env)[-1]
    settings = load_settings(
        {"TABLE_NAME": table, "AWS_ENDPOINT_URL_DYNAMODB": dynamodb_endpoint, "WORKER_ID": "w-ok"}
    )

    async def check() -> None:
        async with aioboto3.Session().client(
            "dynamodb", endpoint_url=dynamodb_endpoint, region_name="us-east-1"
        ) as client:
            await check_lease_table(client, settings, limit=5)

    asyncio.run(check())
