"""Refuse to start against a lease table that cannot work: missing, unreachable, or not ours.

A worker pointed at a missing table, or at an endpoint nothing answers on, used to run on and
log a warning every heartbeat; ECS saw a healthy-looking task until the health check failed.
Before any loop starts, the worker now reads the table three ways, with calls the task role is
granted (GetItem, Query: no DescribeTable, which is the operator's):

- GetItem of its own session key: the table exists and the credentials may read it;
- a one-item Query of each GSI the lease loops use (`by-state-expiry`, `by-owner`): the table
  is a lease table (`leaseworker table create` or the stack made it), not some other table.

A definitive answer (no such table, no such index, access denied, no credentials) fails at
once. An unreachable endpoint, a timeout, a throttle or a server error is retried until
START_CHECK_SECONDS have passed since the check began, so a task whose network comes up a
moment late still starts; past that the worker exits. Either way it exits with
EXIT_NOT_STARTED and one line naming the table, the endpoint and the cause, which the supervisor
passes on as its own status (it has nothing to fence: no session item was ever written).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Final

from botocore.exceptions import NoCredentialsError, PartialCredentialsError

from leaseworker.clock import monotonic
from leaseworker.lease.dynamodb import call_with_deadline
from leaseworker.lease.errors import StoreError, StoreRejected, TableMissing
from leaseworker.lease.model import STARTED
from leaseworker.lease.vocabulary import INDEX_BY_OWNER, INDEX_BY_STATE_EXPIRY, WORKER_KEY_PREFIX
from leaseworker.settings import Settings
from leaseworker.supervisor.process import EXIT_NOT_STARTED

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb import DynamoDBClient

__all__ = ["EXIT_NOT_STARTED", "START_CHECK_SECONDS", "StartRefused", "check_lease_table"]

# How long an unreachable or failing endpoint is retried before the worker exits. Far below the
# lease (a worker that cannot reach the table owns nothing), and short enough for ECS to show
# the reason within seconds of the task starting.
START_CHECK_SECONDS: Final = 8.0
RETRY_PAUSE_SECONDS: Final = 0.5
NO_ATTEMPT: Final = "no attempt"


class StartRefused(Exception):
    """The lease table cannot be used: str() is the one line to print before exiting."""


async def check_lease_table(
    ddb: DynamoDBClient, settings: Settings, *, limit: float = START_CHECK_SECONDS
) -> None:
    """Return once the table answers as a lease table; raise StartRefused otherwise (bounded)."""
    where = f"table {settings.table_name!r} at {settings.endpoint_url or 'the default AWS endpoint'}"
    deadline = monotonic() + limit
    calls = _calls(ddb, settings)
    done = 0
    last = NO_ATTEMPT
    while True:
        remaining = deadline - monotonic()
        if remaining <= 0:
            raise StartRefused(
                f"cannot use {where}: no answer within {limit:g} s ({last}); check the endpoint, "
                "the network path to DynamoDB and TABLE_NAME"
            )
        what, make = calls[done]
        try:
            async with asyncio.timeout(remaining):  # ours: the last cause seen stays the reason
                await call_with_deadline(make(), limit)
        except TimeoutError:
            last = last if last != NO_ATTEMPT else "no reply"
            continue
        except TableMissing:
            raise StartRefused(
                f"{where} does not exist: create it (`leaseworker table create`) or set TABLE_NAME to "
                "the stack's TableName output"
            ) from None
        except StoreRejected as error:
            raise StartRefused(f"cannot use {where}: {what} was refused: {_one_line(error)}") from None
        except StoreError as error:
            cause = _root(error)
            if isinstance(cause, NoCredentialsError | PartialCredentialsError):
                raise StartRefused(f"cannot use {where}: no AWS credentials ({cause})") from None
            last = _one_line(cause)
            await asyncio.sleep(min(RETRY_PAUSE_SECONDS, max(0.0, deadline - monotonic())))
            continue
        done += 1
        if done == len(calls):
            return


def _calls(ddb: DynamoDBClient, settings: Settings) -> list[tuple[str, Any]]:
    table = settings.table_name
    me = {"S": f"{WORKER_KEY_PREFIX}{settings.worker_id}"}
    return [
        (
            "GetItem",
            lambda: ddb.get_item(TableName=table, Key={"connection_id": me}, ProjectionExpression="hb"),
        ),
        (
            f"a Query of index {INDEX_BY_STATE_EXPIRY!r}",
            lambda: ddb.query(
                TableName=table,
                IndexName=INDEX_BY_STATE_EXPIRY,
                KeyConditionExpression="desired_state = :s",
                ExpressionAttributeValues={":s": {"S": STARTED}},
                Limit=1,
            ),
        ),
        (
            f"a Query of index {INDEX_BY_OWNER!r}",
            lambda: ddb.query(
                TableName=table,
                IndexName=INDEX_BY_OWNER,
                KeyConditionExpression="lease_owner = :me",
                ExpressionAttributeValues={":me": {"S": settings.worker_id}},
                Limit=1,
            ),
        ),
    ]


def _root(error: BaseException) -> BaseException:
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:300] or type(error).__name__
