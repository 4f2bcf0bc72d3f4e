"""The expressions that connection-item writes share: their conditions, and the cursor set with a seq.

ConnectionStore writes leases with them; the session-held store (lease/held_store.py) claims with
COND_ACQUIRE and sets the cursor, and the operator's writes (lease/admin.py) set the cursor too.
It imports nothing of the worker, so any store may share it.
"""

from __future__ import annotations

from typing import Any, Final

# Condition expressions, named once (STYLE.md §11).
COND_ACQUIRE = (
    "desired_state = :started AND "
    "(attribute_not_exists(lease_expires_at_ms) OR lease_expires_at_ms < :now_minus_skew)"
)
COND_HELD = "lease_owner = :me AND lease_epoch = :epoch"
COND_HELD_AND_STARTED = f"{COND_HELD} AND desired_state = :started"
# Renewals are pipelined (worker/keeper.py): an older one landing after a newer one must not move
# the expiry back below what the newer one wrote, which its holder already counts on (S1).
COND_RENEW = f"{COND_HELD_AND_STARTED} AND lease_expires_at_ms < :expires"
# S3: a checkpoint never moves backwards, whatever order concurrent writes land in.
# The cursor is written with the seq it belongs to, in the same write: `:cursor` is JSON text, or
# NULL when the feed has none (DynamoDB's NULL type, so the attribute never keeps a stale cursor).
SET_CURSOR = "#cursor = :cursor"
CURSOR_NAMES: Final = {"#cursor": "cursor"}  # CURSOR is a DynamoDB reserved word
COND_CHECKPOINT = f"{COND_HELD} AND (attribute_not_exists(last_seq) OR last_seq < :seq)"
COND_EXISTS = "attribute_exists(connection_id)"


def cursor_value(cursor: str | None) -> dict[str, Any]:
    """The `:cursor` value of a checkpoint write (`SET_CURSOR`)."""
    return {":cursor": {"NULL": True} if cursor is None else {"S": cursor}}


def cursor_names(update: str) -> dict[str, Any]:
    """ExpressionAttributeNames for an update that may set the cursor."""
    return {"ExpressionAttributeNames": CURSOR_NAMES} if "#cursor" in update else {}
