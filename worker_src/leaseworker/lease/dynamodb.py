"""DynamoDB calls with a deadline, and their errors as typed exceptions (every lease store uses these).

Every call runs under `asyncio.timeout` and the client's retries are bounded, so one call can
never block for longer than the caller allows (a throttling storm held one botocore call for 48 s
with standard retries). ClientErrors become StoreError subclasses (lease/errors.py), except a
lost condition, which callers turn into a value.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar, cast

from botocore.exceptions import BotoCoreError, ClientError

from leaseworker.clock import wall_ns
from leaseworker.lease.errors import StoreRejected, StoreThrottled, StoreUnavailable, TableMissing

CONDITION_FAILED = "ConditionalCheckFailedException"
THROTTLE_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TransactionInProgressException",
    }
)

REJECTED_CODES = frozenset(
    {
        "ValidationException",
        "AccessDeniedException",
        "UnrecognizedClientException",
        "ConditionalCheckFailedException",
    }
)

T = TypeVar("T")


def now_ms() -> int:
    return wall_ns() // 1_000_000


async def call_with_deadline(
    awaitable: Awaitable[T], limit: float, *, passthrough: frozenset[str] = frozenset({CONDITION_FAILED})
) -> T:
    """Await one DynamoDB call under `limit` seconds, turning every failure into a typed error.

    ClientErrors whose code is in `passthrough` (by default a lost condition: a race, which
    callers turn into a value) are re-raised as they are.
    """
    try:
        async with asyncio.timeout(limit):
            return await awaitable
    except TimeoutError:
        raise StoreUnavailable(f"DynamoDB call exceeded its {limit:.2f} s deadline") from None
    except ClientError as error:
        if error_code(error) in passthrough:
            raise
        raise translate_client_error(error) from error
    except BotoCoreError as error:
        raise StoreUnavailable(f"DynamoDB unreachable: {error}") from error


def error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def translate_client_error(error: ClientError) -> Exception:
    code = error_code(error)
    message = str(error.response.get("Error", {}).get("Message", code))
    if code in THROTTLE_CODES:
        return StoreThrottled(f"{code}: {message}")
    if code == "ResourceNotFoundException":
        return TableMissing(message)
    if code in REJECTED_CODES:
        return StoreRejected(f"{code}: {message}")
    return StoreUnavailable(f"{code}: {message}")


def old_item(error: ClientError) -> dict[str, Any]:
    # Present when the call set ReturnValuesOnConditionCheckFailure=ALL_OLD and the item exists.
    item = cast(dict[str, Any], error.response).get("Item")
    return dict(item) if isinstance(item, dict) else {}
