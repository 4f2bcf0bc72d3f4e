"""An in-memory DynamoDB client for the lease stores, charging DynamoDB's on-demand cost rules.

It implements the calls and request shapes that lease/connection_store.py, connection_reads.py,
held_store.py, held_reads.py, session_store.py, checkpoint_store.py, batch_get.py and admin.py send:
UpdateItem, PutItem, DeleteItem, BatchWriteItem, TransactWriteItems (admin.py's `remove`), GetItem,
BatchGetItem, Query and Scan (on the table's two KEYS_ONLY GSIs), with ConditionExpression,
UpdateExpression, ProjectionExpression, ExpressionAttributeNames/Values, ReturnValues, pagination
(Limit, the 1 MB page, ExclusiveStartKey) and Select=COUNT. A refused condition is botocore's ClientError
`ConditionalCheckFailedException`, carrying the old item when the request set
ReturnValuesOnConditionCheckFailure=ALL_OLD, as aiobotocore raises it.

Each call is charged to the client's `Meter` with bench/capacity.py's rules (write_units,
read_units); a refused conditional write costs ceil(item size / 1 KB) (at least 1) write units
and no index units, since nothing was written. Every worker gets its own client over one shared
`Database`, so the units are per worker. The calls never suspend: the virtual clock does not
move during a call (bench/simulator/clock.py).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from bench.capacity import index_entry, item_size, read_units, write_units
from bench.counting import kind_of
from bench.simulator import expressions
from bench.simulator.memory_table import Database, Table, sort_value

PAGE_BYTES = 1024 * 1024  # a Query page ends once it has read 1 MB
BATCH_GET_LIMIT = 100
BATCH_WRITE_LIMIT = 25
ITEM_LIMIT_BYTES = 400 * 1024


@dataclass
class Meter:
    """Units and calls charged to one worker, by the kind of request (bench/counting.kind_of)."""

    rru: float = 0.0
    wru: float = 0.0
    calls: Counter[str] = field(default_factory=Counter)
    units: dict[str, float] = field(default_factory=dict)

    def charge(self, kind: str, *, rru: float = 0.0, wru: float = 0.0, calls: int = 1) -> None:
        self.rru += rru
        self.wru += wru
        self.calls[kind] += calls
        self.units[kind] = self.units.get(kind, 0.0) + rru + wru


def client_error(code: str, message: str, operation: str, item: dict[str, Any] | None = None) -> ClientError:
    response: dict[str, Any] = {"Error": {"Code": code, "Message": message}}
    if item is not None:
        response["Item"] = item
    return ClientError(response, operation)  # type: ignore[arg-type]


class MemoryDynamoDB:
    """The subset of aiobotocore's DynamoDB client that the lease stores call."""

    def __init__(self, database: Database, meter: Meter | None = None) -> None:
        self.database = database
        self.meter = meter if meter is not None else Meter()

    # ------------------------------------------------------------------ writes

    async def update_item(self, **request: Any) -> dict[str, Any]:
        table, cid, before = self._locate(request, "UpdateItem")
        names = request.get("ExpressionAttributeNames", {})
        values = request.get("ExpressionAttributeValues", {})
        self._check_condition(request, "UpdateItem", before, values, names)
        after = _updated(request, before)
        self._write("UpdateItem", request, table=table, cid=cid, before=before, after=after)
        return {"Attributes": _returned(request.get("ReturnValues"), before, after)}

    async def put_item(self, **request: Any) -> dict[str, Any]:
        item = request["Item"]
        table, cid, before = self._locate(
            request | {"Key": {"connection_id": item["connection_id"]}}, "PutItem"
        )
        self._check_condition(
            request,
            "PutItem",
            before,
            request.get("ExpressionAttributeValues", {}),
            request.get("ExpressionAttributeNames", {}),
        )
        self._write("PutItem", request, table=table, cid=cid, before=before, after=dict(item))
        return {"Attributes": dict(before)} if request.get("ReturnValues") == "ALL_OLD" and before else {}

    async def delete_item(self, **request: Any) -> dict[str, Any]:
        table, cid, before = self._locate(request, "DeleteItem")
        self._check_condition(
            request,
            "DeleteItem",
            before,
            request.get("ExpressionAttributeValues", {}),
            request.get("ExpressionAttributeNames", {}),
        )
        self._write("DeleteItem", request, table=table, cid=cid, before=before, after=None)
        return {"Attributes": dict(before)} if request.get("ReturnValues") == "ALL_OLD" and before else {}

    def _locate(self, request: dict[str, Any], operation: str) -> tuple[Table, str, dict[str, Any] | None]:
        table = self._table(request["TableName"], operation)
        try:
            cid = table.key_of(request["Key"])
        except KeyError as error:
            raise client_error("ValidationException", str(error), operation) from None
        return table, cid, table.items.get(cid)

    def _check_condition(
        self,
        request: dict[str, Any],
        operation: str,
        before: dict[str, Any] | None,
        values: dict[str, Any],
        names: dict[str, str],
    ) -> None:
        text = request.get("ConditionExpression")
        if not text or expressions.condition(text)(before or {}, values, names):
            return
        units = float(max(1, math.ceil(item_size(before) / 1024)))
        self._charge(operation, request, wru=units)
        old = (
            dict(before)
            if before and request.get("ReturnValuesOnConditionCheckFailure") == "ALL_OLD"
            else None
        )
        raise client_error(
            "ConditionalCheckFailedException", "The conditional request failed", operation, old
        )

    def _write(
        self,
        operation: str,
        request: dict[str, Any],
        *,
        table: Table,
        cid: str,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
    ) -> None:
        _check_size(after, operation)
        price = write_units(before, after)
        table.store(cid, before, after)
        self._charge(operation, request, wru=price.total)

    async def batch_write_item(self, **request: Any) -> dict[str, Any]:
        """Puts and deletes, each unconditional, as BatchWriteItem's; nothing left unprocessed."""
        for name, writes in request["RequestItems"].items():
            if len(writes) > BATCH_WRITE_LIMIT:
                raise client_error("ValidationException", "Too many items requested", "BatchWriteItem")
            for write in writes:
                if "PutRequest" in write:
                    await self.put_item(TableName=name, Item=write["PutRequest"]["Item"])
                else:
                    await self.delete_item(TableName=name, Key=write["DeleteRequest"]["Key"])
        return {"UnprocessedItems": {}}

    async def transact_write_items(self, **request: Any) -> dict[str, Any]:
        """All or nothing: every condition is checked first (ConditionCheck, Update, Put, Delete),
        then all are applied, each at twice its write units (DynamoDB's transactional price). A
        refusal is `TransactionCanceledException` with one reason per item, as aiobotocore raises."""
        staged = []
        reasons = []
        for entry in request["TransactItems"]:
            ((action, body),) = entry.items()
            key = body["Item"] if action == "Put" else body["Key"]
            table, cid, before = self._locate(body | {"Key": {"connection_id": key["connection_id"]}}, action)
            text = body.get("ConditionExpression")
            values = body.get("ExpressionAttributeValues", {})
            names = body.get("ExpressionAttributeNames", {})
            ok = not text or expressions.condition(text)(before or {}, values, names)
            reasons.append({"Code": "None"} if ok else {"Code": "ConditionalCheckFailed"})
            staged.append((action, body, table, cid, before))
        if any(r["Code"] != "None" for r in reasons):
            self._charge("TransactWriteItems", request, wru=2.0 * len(staged))
            error = client_error("TransactionCanceledException", "cancelled", "TransactWriteItems")
            error.response["CancellationReasons"] = reasons  # type: ignore[typeddict-item]
            raise error
        # Every post-image before any is stored: a refusal (the key, the size) applies nothing.
        writes = [
            (table, cid, before, None if action == "ConditionCheck" else _after(action, body, before))
            for action, body, table, cid, before in staged
        ]
        units = 0.0
        for (action, *_), (table, cid, before, after) in zip(staged, writes, strict=True):
            if action == "ConditionCheck":
                units += 2.0 * max(1, math.ceil(item_size(before) / 1024))
                continue
            units += 2.0 * write_units(before, after).total
            table.store(cid, before, after)
        self._charge("TransactWriteItems", request, wru=units)
        return {}

    # ------------------------------------------------------------------ reads

    async def get_item(self, **request: Any) -> dict[str, Any]:
        _, _, item = self._locate(request, "GetItem")
        consistent = bool(request.get("ConsistentRead"))
        self._charge(
            "GetItem", request, rru=read_units([item] if item else [], consistent=consistent, per_item=True)
        )
        if item is None:
            return {}
        names = request.get("ExpressionAttributeNames", {})
        return {"Item": expressions.project(item, request.get("ProjectionExpression"), names)}

    async def batch_get_item(self, **request: Any) -> dict[str, Any]:
        responses: dict[str, list[dict[str, Any]]] = {}
        for name, wanted in request["RequestItems"].items():
            table = self._table(name, "BatchGetItem")
            keys = wanted["Keys"]
            if len(keys) > BATCH_GET_LIMIT:
                raise client_error("ValidationException", "Too many items requested", "BatchGetItem")
            found = [table.items[cid] for cid in (table.key_of(k) for k in keys) if cid in table.items]
            consistent = bool(wanted.get("ConsistentRead"))
            self._charge("BatchGetItem", request, rru=read_units(found, consistent=consistent, per_item=True))
            names = wanted.get("ExpressionAttributeNames", {})
            projection = wanted.get("ProjectionExpression")
            responses[name] = [expressions.project(item, projection, names) for item in found]
        return {"Responses": responses, "UnprocessedKeys": {}}

    async def query(self, **request: Any) -> dict[str, Any]:
        table = self._table(request["TableName"], "Query")
        index_name = request.get("IndexName")
        if index_name not in table.indexes:
            raise client_error(
                "ValidationException", f"no index {index_name!r} (table queries: unused)", "Query"
            )
        if request.get("ConsistentRead"):
            raise client_error("ValidationException", "Consistent reads are not supported on GSIs", "Query")
        index = table.indexes[index_name]
        names = request.get("ExpressionAttributeNames", {})
        values = request["ExpressionAttributeValues"]
        key = expressions.key_condition(request["KeyConditionExpression"])
        if expressions.attribute_name(key.partition, names) != index.partition_name:
            raise client_error("ValidationException", "the key condition must name the index's key", "Query")
        partition = index.partitions.get(str(next(iter(values[key.partition_value].values()))))
        start = request.get("ExclusiveStartKey")
        position = None
        if start is not None:
            sort = sort_value(start[index.sort_name]) if index.sort_name else None
            position = (sort, table.key_of({"connection_id": start["connection_id"]}))
        limit = request.get("Limit")
        entries: list[dict[str, Any]] = []
        read_bytes = 0
        last: tuple[Any, str] | None = None
        more = False
        if partition is not None:
            for sort, cid in partition.walk(position, key.sort_filter, index.sort_name, values, names):
                if (limit is not None and len(entries) >= limit) or read_bytes >= PAGE_BYTES:
                    more = True
                    break
                entry = index_entry(table.items[cid], index.partition_name, index.sort_name)
                assert entry is not None
                entries.append(entry)
                read_bytes += item_size(entry)
                last = (sort, cid)
        self._charge("Query", request, rru=read_units(entries, consistent=False, per_item=False))
        response: dict[str, Any] = {"Count": len(entries), "ScannedCount": len(entries)}
        if request.get("Select") != "COUNT":
            projection = request.get("ProjectionExpression")
            response["Items"] = [expressions.project(e, projection, names) for e in entries]
        if more and last is not None:
            response["LastEvaluatedKey"] = dict(entries[-1])
        return response

    async def scan(self, **request: Any) -> dict[str, Any]:
        """A Scan of one of the table's KEYS_ONLY indexes (absent_owners.held_owners), in one page."""
        table = self._table(request["TableName"], "Scan")
        index_name = request.get("IndexName")
        if index_name not in table.indexes:
            raise client_error(
                "ValidationException", f"no index {index_name!r} (table scans: unused)", "Scan"
            )
        index = table.indexes[index_name]
        entries = [
            entry
            for item in table.items.values()
            if (entry := index_entry(item, index.partition_name, index.sort_name)) is not None
        ]
        self._charge("Scan", request, rru=read_units(entries, consistent=False, per_item=False))
        return {"Items": entries, "Count": len(entries), "ScannedCount": len(entries)}

    # ------------------------------------------------------------------ plumbing

    async def describe_table(self, **request: Any) -> dict[str, Any]:
        table = self._table(request["TableName"], "DescribeTable")
        indexes = [{"IndexName": name, "IndexStatus": "ACTIVE"} for name in table.indexes]
        return {
            "Table": {
                "TableName": request["TableName"],
                "TableStatus": "ACTIVE",
                "GlobalSecondaryIndexes": indexes,
            }
        }

    def _table(self, name: str, operation: str) -> Table:
        table = self.database.tables.get(name)
        if table is None:
            raise client_error(
                "ResourceNotFoundException", f"Requested resource not found: {name}", operation
            )
        return table

    def _charge(self, operation: str, request: dict[str, Any], *, rru: float = 0.0, wru: float = 0.0) -> None:
        kind = kind_of(operation, request)
        self.meter.charge(kind, rru=rru, wru=wru)


def _after(action: str, body: dict[str, Any], before: dict[str, Any] | None) -> dict[str, Any] | None:
    """The item a write leaves (None: deleted), refused as DynamoDB refuses it: an update that
    changes the key, an item over 400 KB."""
    if action == "Delete":
        return None
    after = _updated(body, before) if action == "Update" else dict(body["Item"])
    _check_size(after, f"{action}Item")
    return after


def _updated(body: dict[str, Any], before: dict[str, Any] | None) -> dict[str, Any]:
    """The item an UpdateItem leaves; its size is checked where it is written (`_check_size`)."""
    base = before if before is not None else dict(body["Key"])
    values = body.get("ExpressionAttributeValues", {})
    names = body.get("ExpressionAttributeNames", {})
    after = expressions.update(body["UpdateExpression"]).apply(base, values, names)
    if after.get("connection_id") != body["Key"]["connection_id"]:
        raise client_error("ValidationException", "cannot update the key", "UpdateItem")
    return after


def _check_size(item: dict[str, Any] | None, operation: str) -> None:
    if item is not None and item_size(item) > ITEM_LIMIT_BYTES:
        message = "Item size has exceeded the maximum allowed size"
        raise client_error("ValidationException", message, operation)


def _returned(mode: str | None, before: dict[str, Any] | None, after: dict[str, Any]) -> dict[str, Any]:
    if mode == "ALL_OLD":
        return dict(before or {})
    if mode == "ALL_NEW":
        return dict(after)
    if mode == "UPDATED_NEW":
        return {k: v for k, v in after.items() if (before or {}).get(k) != v}
    if mode == "UPDATED_OLD":
        return {k: v for k, v in (before or {}).items() if after.get(k) != v}
    return {}
