"""Checkpoint items (`worker#<id>#ckpt`, docs/design.md §2b): all of a worker's checkpoints in one write.

The item holds `checkpoints`: a map `{connection_id: [epoch, seq]}`, replaced whole by each write,
conditional on the item not being fenced. A claimer reads the dead holder's item after the fence
and trusts an entry only when its epoch is the connection item's (`resume_seq`).

One item, no sharding: DynamoDB's item limit is 400 KB. A worst-case entry (a 128-character id,
an epoch near 2^53 and a seq near 2^63) takes about 153 bytes, so `MAX_ENTRIES_PER_ITEM` entries
fit with room for the key and the other attributes; the settings validation refuses a
MAX_CONNECTIONS above it (`check_checkpoint_capacity`). With typical 20-character ids an entry is
about 40 bytes, so 1,000 connections cost about 40 write units per checkpoint.

Writes from one store instance never go backwards, even if two of them overlap: each carries
this instance's token and a counter, and DynamoDB refuses an older counter from the same token.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import ClientError

from leaseworker.lease.attribute_values import checkpoint_key, failed_item, purge_at
from leaseworker.lease.dynamodb import call_with_deadline, now_ms
from leaseworker.lease.vocabulary import MAX_ENTRIES_PER_ITEM
from leaseworker.settings import SettingsError

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb import DynamoDBClient

T = TypeVar("T")

# A checkpoint cursor past MAX_CURSOR_BYTES: a resumable feed is marked failed with that reason; a
# non-resumable feed's cursor (informational: the bounds of the next takeover's gap marker) is
# then left out of the checkpoint. The limits live in lease/vocabulary.py.

COND_CHECKPOINT_WRITE = (
    "attribute_not_exists(fenced_by) AND "
    "(attribute_not_exists(#writer) OR #writer <> :writer OR #written < :written)"
)

Entries = Mapping[str, tuple[int, int]]  # connection_id -> (epoch, seq)
Cursors = Mapping[str, str]  # connection_id -> the cursor (JSON text) of its entry, where it has one


class CheckpointTooLarge(ValueError):
    pass


def check_checkpoint_capacity(max_connections: int) -> None:
    """For the settings validation: one checkpoint item must hold MAX_CONNECTIONS entries."""
    if max_connections > MAX_ENTRIES_PER_ITEM:
        raise SettingsError(
            "MAX_CONNECTIONS",
            max_connections,
            f"must be <= {MAX_ENTRIES_PER_ITEM} in session mode (one 400 KB checkpoint item per worker)",
        )


def resume_seq(entries: Entries, connection_id: str, epoch: int) -> int:
    """The dead holder's checkpoint for `connection_id`, if it was written under `epoch`; else -1."""
    entry = entries.get(connection_id)
    return entry[1] if entry is not None and entry[0] == epoch else -1


def entries_from(item: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """A raw checkpoint item's `{connection_id: (epoch, seq)}`; malformed entries are skipped."""
    entries: dict[str, tuple[int, int]] = {}
    for cid, value in item.get("checkpoints", {}).get("M", {}).items():
        pair = value.get("L", [])
        if len(pair) in (2, 3) and all("N" in part for part in pair[:2]):
            entries[cid] = (int(pair[0]["N"]), int(pair[1]["N"]))
    return entries


def cursors_from(item: dict[str, Any]) -> dict[str, str]:
    """A raw checkpoint item's `{connection_id: cursor}` for the entries that carry one."""
    cursors: dict[str, str] = {}
    for cid, value in item.get("checkpoints", {}).get("M", {}).items():
        entry = value.get("L", [])
        if len(entry) == 3 and isinstance(entry[2].get("S"), str):
            cursors[cid] = entry[2]["S"]
    return cursors


def _entry(epoch: int, seq: int, cursor: str | None) -> dict[str, Any]:
    parts: list[dict[str, str]] = [{"N": str(epoch)}, {"N": str(seq)}]
    if cursor is not None:
        parts.append({"S": cursor})
    return {"L": parts}


def effective_checkpoint(last_seq: int, lease_epoch: int, connection_id: str, holder_entries: Entries) -> int:
    """What `connections list/show` report: the newer of the connection item's `last_seq` and
    its holder's checkpoint entry, when that entry was written under the item's epoch."""
    return max(last_seq, resume_seq(holder_entries, connection_id, lease_epoch))


class CheckpointStore:
    def __init__(self, client: DynamoDBClient, table_name: str, *, call_timeout: float = 5.0) -> None:
        self._client = client
        self._table = table_name
        self._call_timeout = call_timeout
        self._writer = secrets.token_hex(8)
        self._written = 0

    async def write(
        self, me: str, entries: Entries, *, cursors: Cursors | None = None, timeout: float | None = None
    ) -> bool:
        """Replace this worker's checkpoint map. False: the item is fenced (stop delivering)."""
        if len(entries) > MAX_ENTRIES_PER_ITEM:
            raise CheckpointTooLarge(f"{len(entries)} checkpoints exceed {MAX_ENTRIES_PER_ITEM} per item")
        self._written += 1
        now = now_ms()
        cursors = cursors or {}
        encoded = {cid: _entry(epoch, seq, cursors.get(cid)) for cid, (epoch, seq) in entries.items()}
        try:
            await self._call(
                self._client.update_item(
                    TableName=self._table,
                    Key=checkpoint_key(me),
                    UpdateExpression="SET checkpoints = :map, purge_at = :purge, updated_at_ms = :now, "
                    "#writer = :writer, #written = :written",
                    ExpressionAttributeNames={"#writer": "writer", "#written": "written"},
                    ConditionExpression=COND_CHECKPOINT_WRITE,
                    ExpressionAttributeValues={
                        ":map": {"M": encoded},
                        ":purge": {"N": str(purge_at(now))},
                        ":now": {"N": str(now)},
                        ":writer": {"S": self._writer},
                        ":written": {"N": str(self._written)},
                    },
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                ),
                timeout,
            )
        except ClientError as error:
            # Fenced, or a later write of ours already landed (it holds newer checkpoints).
            return "fenced_by" not in failed_item(error)
        return True

    async def read(self, worker: str) -> dict[str, tuple[int, int]]:
        """The worker's last written checkpoints (a consistent read: the claimer reads after the fence)."""
        return (await self.read_with_cursors(worker))[0]

    async def read_with_cursors(self, worker: str) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
        """The worker's last written checkpoints and the cursors that go with them."""
        response = await self._call(
            self._client.get_item(
                TableName=self._table,
                Key=checkpoint_key(worker),
                ConsistentRead=True,
                ProjectionExpression="checkpoints",
            )
        )
        item = response.get("Item", {})
        return entries_from(item), cursors_from(item)

    async def fence(self, worker: str, *, by: str, kind: str) -> None:
        """Refuse `worker`'s later checkpoint writes (called by SessionStore.fence).

        Unconditional, and creating a stub when the item does not exist yet, so that the
        fenced worker's first write is refused too; the stub expires through the TTL.
        """
        now = now_ms()
        await self._call(
            self._client.update_item(
                TableName=self._table,
                Key=checkpoint_key(worker),
                UpdateExpression="SET fenced_by = :by, fence_kind = :kind, fenced_at_ms = :now, "
                "purge_at = if_not_exists(purge_at, :purge)",
                ExpressionAttributeValues={
                    ":by": {"S": by},
                    ":kind": {"S": kind},
                    ":now": {"N": str(now)},
                    ":purge": {"N": str(purge_at(now))},
                },
            )
        )

    async def _call(self, awaitable: Awaitable[T], timeout: float | None = None) -> T:
        return await call_with_deadline(awaitable, self._call_timeout if timeout is None else timeout)
