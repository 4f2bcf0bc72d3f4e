"""DynamoDB's capacity rules, and a cross-check of them against DynamoDB Local.

Rules (on-demand, https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/):
- a write costs ceil(max(size before, size after) / 1 KB) write units;
- each GSI pays for its entry too: an entry put or deleted is one unit (entries here are well
  under 1 KB), a changed index key is a delete plus a put (2), an unchanged KEYS_ONLY entry 0;
- a read costs ceil(bytes read / 4 KB) units, halved when eventually consistent; a Query sums
  the entries it reads before rounding.

The cross-check replays one captured sample of each kind with ReturnConsumedCapacity=INDEXES:
writes on a scratch copy of their item (condition dropped: a write that succeeds costs the same
with or without it), reads on the live table; both prices are reported side by side.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.vocabulary import (
    INDEX_BY_OWNER,
    INDEX_BY_OWNER_PK,
    INDEX_BY_STATE_EXPIRY,
    INDEX_BY_STATE_EXPIRY_PK,
    INDEX_BY_STATE_EXPIRY_SK,
)

TABLE_KEY = ("connection_id",)
# (index, partition key, sort key or None); both are KEYS_ONLY (docs/design.md §2).
INDEXES: tuple[tuple[str, str, str | None], ...] = (
    (INDEX_BY_STATE_EXPIRY, INDEX_BY_STATE_EXPIRY_PK, INDEX_BY_STATE_EXPIRY_SK),
    (INDEX_BY_OWNER, INDEX_BY_OWNER_PK, None),
)
SCRATCH_TABLE = "bench-xcheck"
WRITES = ("UpdateItem", "PutItem", "DeleteItem")
_PLACEHOLDER = re.compile(r"[:#]\w+")


def value_size(value: dict[str, Any]) -> int:
    ((tag, inner),) = value.items()
    if tag == "S":
        return len(str(inner).encode())
    if tag == "N":
        digits = len(str(Decimal(str(inner)).normalize()).lstrip("-").replace(".", ""))
        return math.ceil(digits / 2) + 1
    if tag == "B":
        return len(inner)
    if tag in ("BOOL", "NULL"):
        return 1
    if tag == "M":
        return 3 + sum(len(k.encode()) + value_size(v) + 1 for k, v in inner.items())
    if tag == "L":
        return 3 + sum(value_size(v) + 1 for v in inner)
    if tag in ("SS", "NS", "BS"):
        return sum(value_size({tag[0]: v}) for v in inner)
    raise ValueError(f"unknown attribute type {tag}")


def item_size(item: dict[str, Any] | None) -> int:
    return sum(len(name.encode()) + value_size(value) for name, value in (item or {}).items())


def index_entry(item: dict[str, Any] | None, partition: str, sort: str | None) -> dict[str, Any] | None:
    names = (partition, sort) if sort else (partition,)
    if not item or any(name not in item for name in names):
        return None
    return {name: item[name] for name in (*names, *TABLE_KEY)}


@dataclass
class WritePrice:
    table: float
    indexes: dict[str, float] = field(default_factory=dict)
    partitions: dict[str, str] = field(default_factory=dict)  # index -> partition written

    @property
    def total(self) -> float:
        return self.table + sum(self.indexes.values())


def write_units(before: dict[str, Any] | None, after: dict[str, Any] | None) -> WritePrice:
    price = WritePrice(table=max(1, math.ceil(max(item_size(before), item_size(after)) / 1024)))
    for name, partition, sort in INDEXES:
        old, new = index_entry(before, partition, sort), index_entry(after, partition, sort)
        units = 0 if old == new else (2 if old and new else 1)
        if units:
            price.indexes[name] = float(units)
            entry = new or old
            assert entry is not None
            price.partitions[name] = str(next(iter(entry[partition].values())))
    return price


def read_units(entries: list[dict[str, Any]], *, consistent: bool, per_item: bool) -> float:
    factor = 1.0 if consistent else 0.5
    if per_item:  # GetItem, BatchGetItem: each item rounds up on its own
        return factor * sum(max(1, math.ceil(item_size(e) / 4096)) for e in entries) if entries else factor
    return factor * max(1, math.ceil(sum(item_size(e) for e in entries) / 4096))


def without_condition(body: dict[str, Any]) -> dict[str, Any]:
    """The request with its condition dropped and the placeholders only it used pruned."""
    request = {
        k: v
        for k, v in body.items()
        if k not in ("ConditionExpression", "ReturnValuesOnConditionCheckFailure")
    }
    used = set(
        _PLACEHOLDER.findall(
            " ".join(str(request.get(k, "")) for k in ("UpdateExpression", "ProjectionExpression"))
        )
    )
    for key in ("ExpressionAttributeValues", "ExpressionAttributeNames"):
        if key in request:
            kept = {k: v for k, v in request[key].items() if k in used}
            if kept:
                request[key] = kept
            else:
                del request[key]
    return request


def _index_of(body: dict[str, Any]) -> tuple[str, str, str | None] | None:
    return next((spec for spec in INDEXES if spec[0] == body.get("IndexName")), None)


class CrossCheck:
    """Prices one sample request by the rules and by DynamoDB Local's ConsumedCapacity."""

    def __init__(self, client: Any, table: str) -> None:
        self._client = client
        self._table = table
        self._scratch_ready = False

    async def price(self, operation: str, body: dict[str, Any]) -> dict[str, Any]:
        if operation in WRITES:
            return await self._write(operation, body)
        return await self._read(operation, body)

    async def _write(self, operation: str, body: dict[str, Any]) -> dict[str, Any]:
        if not self._scratch_ready:
            await LeaseTableAdmin(self._client, SCRATCH_TABLE).create_table()
            self._scratch_ready = True
        key = body.get("Key") or {name: body["Item"][name] for name in TABLE_KEY}
        live = await self._client.get_item(TableName=self._table, Key=key, ConsistentRead=True)
        before = live.get("Item")
        await self._client.delete_item(TableName=SCRATCH_TABLE, Key=key)
        if before:
            await self._client.put_item(TableName=SCRATCH_TABLE, Item=before)
        request = without_condition(body) | {"TableName": SCRATCH_TABLE, "ReturnConsumedCapacity": "INDEXES"}
        request.pop("ReturnValues", None)
        response = await getattr(self._client, _snake(operation))(**request)
        after = (await self._client.get_item(TableName=SCRATCH_TABLE, Key=key, ConsistentRead=True)).get(
            "Item"
        )
        rules = write_units(before, after)
        local = response.get("ConsumedCapacity", {})
        return {
            "rules": rules.total,
            "rules_indexes": rules.indexes,
            "partitions": rules.partitions,
            "local": float(local.get("CapacityUnits", float("nan"))),
            "local_indexes": {
                k: float(v["CapacityUnits"]) for k, v in local.get("GlobalSecondaryIndexes", {}).items()
            },
            "item_bytes": max(item_size(before), item_size(after)),
            **_checkpoint_shape(after),
            "write": True,
        }

    async def _read(self, operation: str, body: dict[str, Any]) -> dict[str, Any]:
        request = dict(body) | {"ReturnConsumedCapacity": "INDEXES"}
        response = await getattr(self._client, _snake(operation))(**request)
        local = response.get("ConsumedCapacity", {})
        if operation == "BatchGetItem":
            consistent = any(r.get("ConsistentRead") for r in body["RequestItems"].values())
            items = [i for found in response.get("Responses", {}).values() for i in found]
            rules = read_units(items, consistent=consistent, per_item=True)
            local_units = sum(float(c["CapacityUnits"]) for c in local) if isinstance(local, list) else 0.0
            return {"rules": rules, "local": local_units, "items": len(items), "write": False}
        if operation == "GetItem":
            found = await self._client.get_item(TableName=body["TableName"], Key=body["Key"])
            item = found.get("Item")
            rules = read_units(
                [item] if item else [], consistent=bool(body.get("ConsistentRead")), per_item=True
            )
        else:  # Query, Scan: price what the index or table holds for each entry read
            spec = _index_of(body)
            full = {k: v for k, v in body.items() if k != "ProjectionExpression"}
            entries: list[dict[str, Any]] = []
            while True:
                page = await getattr(self._client, _snake(operation))(**full)
                items = page.get("Items", [])
                entries += [index_entry(i, spec[1], spec[2]) or i for i in items] if spec else items
                if not page.get("LastEvaluatedKey") or "Limit" in body:
                    break
                full["ExclusiveStartKey"] = page["LastEvaluatedKey"]
            rules = read_units(entries, consistent=bool(body.get("ConsistentRead")), per_item=False)
        return {
            "rules": rules,
            "local": float(local.get("CapacityUnits", float("nan"))),
            "items": len(response.get("Items", [response.get("Item")] if operation == "GetItem" else [])),
            "write": False,
        }


def _checkpoint_shape(item: dict[str, Any] | None) -> dict[str, Any]:
    """For a checkpoint item: how many entries its map holds and its size without them."""
    if not item or "checkpoints" not in item:
        return {}
    rest = {k: v for k, v in item.items() if k != "checkpoints"}
    return {"entries": len(item["checkpoints"]["M"]), "fixed_bytes": item_size(rest) + len("checkpoints") + 3}


def _snake(operation: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", operation).lower()
