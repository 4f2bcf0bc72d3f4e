"""Small readers of DynamoDB attribute values and ClientErrors, shared by the session-mode stores."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from botocore.exceptions import ClientError

from leaseworker.lease.vocabulary import CHECKPOINT_KEY_SUFFIX, WORKER_KEY_PREFIX

PURGE_AFTER_SECONDS = 3 * 24 * 3600  # TTL: workers' items are garbage-collected days after their last write


def session_key(worker_id: str) -> dict[str, Any]:
    return {"connection_id": {"S": f"{WORKER_KEY_PREFIX}{worker_id}"}}


def checkpoint_key(worker_id: str) -> dict[str, Any]:
    return {"connection_id": {"S": f"{WORKER_KEY_PREFIX}{worker_id}{CHECKPOINT_KEY_SUFFIX}"}}


def purge_at(now_ms: int) -> int:
    """The TTL attribute's value (epoch seconds) for an item written at `now_ms`."""
    return now_ms // 1000 + PURGE_AFTER_SECONDS


def error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def failed_item(error: ClientError) -> dict[str, Any]:
    """The item as it was when a condition failed (ReturnValuesOnConditionCheckFailure=ALL_OLD);
    empty when the item did not exist."""
    item = cast(dict[str, Any], error.response).get("Item")
    return dict(item) if isinstance(item, dict) else {}


def text(item: Mapping[str, Any], name: str) -> str | None:
    value = item.get(name)
    if isinstance(value, dict) and isinstance(value.get("S"), str):
        return str(value["S"])
    return None


def number(item: Mapping[str, Any], name: str, default: int = 0) -> int:
    value = item.get(name)
    if isinstance(value, dict) and isinstance(value.get("N"), str):
        try:
            return int(value["N"])
        except ValueError:
            return default
    return default


def optional_number(item: Mapping[str, Any], name: str) -> int | None:
    return number(item, name) if name in item else None
