"""The operator's conditional writes to a connection item, as values: one UpdateItem each, or many
in one TransactWriteItems (`connections apply`, at most TRANSACT_MAX per call).

Every write here is conditioned on the item: an add only over nothing or a tombstone (so a live
connection is never overwritten and a tombstone's epoch is kept), any other write only on a live
item. None of them sets a lease's owner, epoch or expiry, nor the checkpoint of a live item.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from leaseworker.lease.dynamodb import now_ms
from leaseworker.lease.model import NO_CHECKPOINT, STARTED, STOPPED
from leaseworker.lease.removal import COND_LIVE

TRANSACT_MAX: Final = 100  # DynamoDB's limit of items in one TransactWriteItems

# A new item, or a tombstone (it carries `removed_at_ms`) to resurrect.
COND_ADDABLE = "attribute_not_exists(connection_id) OR attribute_exists(removed_at_ms)"

# `add`: a new item (STARTED, or STOPPED from `connections apply`), or a tombstone resurrected
# with its epoch kept. The protocol attributes are set when given and removed when not, as is
# the checkpoint cursor: a re-added id starts from no checkpoint (docs/design.md §4).
UPDATE_ADD = (
    "SET desired_state = :state, ws_url = :url, last_seq = :none, lease_expires_at_ms = :zero, "
    "failures = :zero, updated_at_ms = :now, lease_epoch = if_not_exists(lease_epoch, :zero), "
    "protocol = :protocol{config}{preset} "
    "REMOVE removed_at_ms, last_error, lease_owner, #cursor{no_config}{no_preset}"
)

# `connections apply` changing a live connection's feed and desired state in one write. Only
# these attributes: the lease (owner, epoch, expiry) and the checkpoint are the workers'. The
# owner keeps the feed it acquired until the connection is next acquired (a lease carries it).
UPDATE_FEED = (
    "SET desired_state = :state, ws_url = :url, protocol = :protocol, updated_at_ms = :now"
    "{config}{preset}{remove}"
)


@dataclass(frozen=True, slots=True)
class ItemUpdate:
    """One conditional UpdateItem on the connection item `connection_id`."""

    connection_id: str
    update: str
    condition: str
    values: dict[str, Any]
    names: dict[str, str] = field(default_factory=dict)

    def request(self, table: str) -> dict[str, Any]:
        request: dict[str, Any] = {
            "TableName": table,
            "Key": {"connection_id": {"S": self.connection_id}},
            "UpdateExpression": self.update,
            "ConditionExpression": self.condition,
            "ExpressionAttributeValues": self.values,
        }
        if self.names:
            request["ExpressionAttributeNames"] = self.names
        return request


def desired(state: str) -> str:
    if state not in (STARTED, STOPPED):
        raise ValueError(f"invalid desired state {state!r}: must be {STARTED} or {STOPPED}")
    return state


def add_update(
    connection_id: str,
    url: str,
    *,
    protocol: str,
    protocol_config: str | None,
    preset: str | None,
    state: str = STARTED,
) -> ItemUpdate:
    values: dict[str, Any] = {
        ":state": {"S": desired(state)},
        ":url": {"S": url},
        ":none": {"N": str(NO_CHECKPOINT)},
        # 0, not absent: new connections must appear in the by-state-expiry GSI.
        ":zero": {"N": "0"},
        ":now": {"N": str(now_ms())},
        ":protocol": {"S": protocol},
    }
    if protocol_config is not None:
        values[":config"] = {"S": protocol_config}
    if preset is not None:
        values[":preset"] = {"S": preset}
    update = UPDATE_ADD.format(
        config=", protocol_config = :config" if protocol_config is not None else "",
        preset=", preset = :preset" if preset is not None else "",
        no_config="" if protocol_config is not None else ", protocol_config",
        no_preset="" if preset is not None else ", preset",
    )
    return ItemUpdate(connection_id, update, COND_ADDABLE, values, {"#cursor": "cursor"})


def feed_update(
    connection_id: str,
    url: str,
    *,
    protocol: str,
    protocol_config: str | None,
    preset: str | None,
    state: str,
) -> ItemUpdate:
    """A live connection's feed and desired state; starting clears a recorded failure."""
    values: dict[str, Any] = {
        ":state": {"S": desired(state)},
        ":url": {"S": url},
        ":protocol": {"S": protocol},
        ":now": {"N": str(now_ms())},
    }
    if protocol_config is not None:
        values[":config"] = {"S": protocol_config}
    if preset is not None:
        values[":preset"] = {"S": preset}
    removed = [
        *(["last_error"] if state == STARTED else []),
        *([] if protocol_config is not None else ["protocol_config"]),
        *([] if preset is not None else ["preset"]),
    ]
    update = UPDATE_FEED.format(
        config=", protocol_config = :config" if protocol_config is not None else "",
        preset=", preset = :preset" if preset is not None else "",
        remove=f" REMOVE {', '.join(removed)}" if removed else "",
    )
    return ItemUpdate(connection_id, update, COND_LIVE, values)


def state_update(connection_id: str, state: str) -> ItemUpdate:
    """A live connection's desired state; starting clears a recorded failure (a fresh chance)."""
    update = "SET desired_state = :state, updated_at_ms = :now"
    values: dict[str, Any] = {":state": {"S": desired(state)}, ":now": {"N": str(now_ms())}}
    if state == STARTED:
        update += " REMOVE last_error"
    return ItemUpdate(connection_id, update, COND_LIVE, values)
