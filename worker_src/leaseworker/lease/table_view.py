"""The operator's reads of the lease table (`connections list/show`, `status`, the local fleet's
views): items as plain JSON values, each connection with its effective checkpoint (docs/design.md
§2b), the newer of its own `last_seq` and its holder's batched checkpoint entry."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from leaseworker.lease.attribute_values import checkpoint_key
from leaseworker.lease.checkpoint_store import (
    Cursors,
    Entries,
    cursors_from,
    effective_checkpoint,
    entries_from,
)
from leaseworker.lease.model import NO_CHECKPOINT
from leaseworker.lease.vocabulary import BUDGET_KEY_PREFIX, CHECKPOINT_KEY_SUFFIX, WORKER_KEY_PREFIX

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb import DynamoDBClient

Snapshot = tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]  # (connections, sessions by id)
Call = Callable[[Awaitable[Any]], Awaitable[Any]]  # a DynamoDB call, with its deadline and errors


class TableView:
    def __init__(self, client: DynamoDBClient, table: str, call: Call) -> None:
        self._client = client
        self._table = table
        self._call = call

    async def raw_item(self, key: str) -> dict[str, Any] | None:
        """Any item by key, a worker's own included (`worker#<id>`), as plain values."""
        response = await self._call(
            self._client.get_item(
                TableName=self._table, Key={"connection_id": {"S": key}}, ConsistentRead=True
            )
        )
        item = response.get("Item")
        return plain(item) if item else None

    async def connection(self, connection_id: str) -> dict[str, Any] | None:
        """One connection with its effective checkpoint; None if absent or a tombstone."""
        shown = await self.raw_item(connection_id)
        if shown is None or "removed_at_ms" in shown:
            return None
        holder = shown.get("lease_owner")
        entries: Entries = {}
        cursors: Cursors = {}
        if isinstance(holder, str) and holder:
            checkpoint = await self._call(
                self._client.get_item(TableName=self._table, Key=checkpoint_key(holder), ConsistentRead=True)
            )
            entries = entries_from(checkpoint.get("Item", {}))
            cursors = cursors_from(checkpoint.get("Item", {}))
        return with_checkpoint(shown, entries, cursors)

    async def snapshot(self) -> Snapshot:
        """One consistent scan: the connections (tombstones hidden, sorted by id, each with its
        effective checkpoint) and the session items by worker id. The scan reads the workers'
        checkpoint items too, so the effective checkpoints cost no extra call."""
        items: list[dict[str, Any]] = []
        sessions: dict[str, dict[str, Any]] = {}
        checkpoints: dict[str, Entries] = {}
        cursors: dict[str, Cursors] = {}
        start_key: dict[str, Any] | None = None
        while True:
            kwargs: dict[str, Any] = {"TableName": self._table, "ConsistentRead": True}
            if start_key:
                kwargs["ExclusiveStartKey"] = start_key
            response = await self._call(self._client.scan(**kwargs))
            for item in response.get("Items", []):
                key = item["connection_id"]["S"]
                if key.startswith(BUDGET_KEY_PREFIX):
                    continue  # a host's connect budget (lease/budget_store.py)
                if not key.startswith(WORKER_KEY_PREFIX):
                    if "removed_at_ms" not in item:
                        items.append(plain(item))
                elif key.endswith(CHECKPOINT_KEY_SUFFIX):
                    worker = key[len(WORKER_KEY_PREFIX) : -len(CHECKPOINT_KEY_SUFFIX)]
                    checkpoints[worker], cursors[worker] = entries_from(item), cursors_from(item)
                else:
                    sessions[key[len(WORKER_KEY_PREFIX) :]] = plain(item)
            start_key = response.get("LastEvaluatedKey")
            if not start_key:
                break
        shown = [
            with_checkpoint(
                item,
                checkpoints.get(str(item.get("lease_owner")), {}),
                cursors.get(str(item.get("lease_owner"))),
            )
            for item in items
        ]
        return sorted(shown, key=lambda item: str(item.get("connection_id"))), sessions


def with_checkpoint(
    item: dict[str, Any], holder_entries: Entries, holder_cursors: Cursors | None = None
) -> dict[str, Any]:
    """The item plus `checkpoint` and `checkpoint_cursor`: what a takeover would resume after
    (docs/design.md §2b), the newer of `last_seq` and the holder's batched checkpoint entry at the
    item's epoch, with the cursor (JSON text) that belongs to it."""
    last_seq = item.get("last_seq", NO_CHECKPOINT)
    epoch = item.get("lease_epoch", 0)
    if not isinstance(last_seq, int) or not isinstance(epoch, int):
        return item
    cid = str(item.get("connection_id"))
    checkpoint = effective_checkpoint(last_seq, epoch, cid, holder_entries)
    cursor = item.get("cursor")
    if checkpoint > last_seq:
        cursor = (holder_cursors or {}).get(cid)
    return item | {"checkpoint": checkpoint, "checkpoint_cursor": cursor}


def plain(item: dict[str, Any]) -> dict[str, Any]:
    """DynamoDB attribute values as plain JSON values (numbers as int)."""
    out: dict[str, Any] = {}
    for name, value in item.items():
        if "S" in value:
            out[name] = value["S"]
        elif "N" in value:
            number = value["N"]
            out[name] = int(number) if number.lstrip("-").isdigit() else float(number)
        elif "BOOL" in value:
            out[name] = value["BOOL"]
        elif "NULL" in value:
            out[name] = None
        else:
            out[name] = value
    return out
