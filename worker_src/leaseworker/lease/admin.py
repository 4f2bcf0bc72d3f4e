"""Operator actions on the lease table: create it, add, stop, start, remove and list connections.

These are the control plane (DESIGN.md §6). They never touch a live lease's owner or epoch
except through `remove`, which deletes the item: its owner's next renewal then fails and the
worker drops the connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from botocore.exceptions import ClientError

from leaseworker.lease.errors import TableMissing
from leaseworker.lease.model import NO_CHECKPOINT, STARTED, STOPPED, ConnectionItem, check_connection_id
from leaseworker.lease.store import (
    COND_EXISTS,
    COND_NEW,
    CONDITION_FAILED,
    GSI_BY_STATE_EXPIRY,
    call_with_deadline,
    now_ms,
    translate_client_error,
)

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb import DynamoDBClient


class ConnectionExists(ValueError):
    pass


class _TableExists(Exception):
    pass


_ADMIN_PASSTHROUGH = frozenset({CONDITION_FAILED, "ResourceInUseException"})


class UnknownConnection(LookupError):
    def __init__(self, connection_id: str) -> None:
        super().__init__(f"no connection {connection_id!r} in the table")
        self.connection_id = connection_id


def check_ws_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"invalid url {url!r}: must be ws:// or wss:// with a host")
    return url


class LeaseTableAdmin:
    def __init__(self, client: DynamoDBClient, table_name: str, *, call_timeout: float = 10.0) -> None:
        self._client = client
        self._table = table_name
        self._timeout = call_timeout

    async def _run(self, coro: Any, *, on_condition_failed: Exception | None = None) -> Any:
        try:
            return await call_with_deadline(coro, self._timeout, passthrough=_ADMIN_PASSTHROUGH)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") == "ResourceInUseException":
                raise _TableExists from None
            if on_condition_failed is not None:
                raise on_condition_failed from None
            raise translate_client_error(error) from error

    async def create_table(self) -> bool:
        """Create the table and its GSI; False if it already exists."""
        try:
            await self._run(
                self._client.create_table(
                    TableName=self._table,
                    BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=[
                        {"AttributeName": "connection_id", "AttributeType": "S"},
                        {"AttributeName": "desired_state", "AttributeType": "S"},
                        {"AttributeName": "lease_expires_at_ms", "AttributeType": "N"},
                    ],
                    KeySchema=[{"AttributeName": "connection_id", "KeyType": "HASH"}],
                    GlobalSecondaryIndexes=[
                        {
                            "IndexName": GSI_BY_STATE_EXPIRY,
                            "KeySchema": [
                                {"AttributeName": "desired_state", "KeyType": "HASH"},
                                {"AttributeName": "lease_expires_at_ms", "KeyType": "RANGE"},
                            ],
                            "Projection": {"ProjectionType": "KEYS_ONLY"},
                        }
                    ],
                )
            )
        except _TableExists:
            return False
        waiter = self._client.get_waiter("table_exists")
        await self._run(waiter.wait(TableName=self._table, WaiterConfig={"Delay": 1, "MaxAttempts": 30}))
        return True

    async def add(self, connection_id: str, url: str) -> None:
        check_connection_id(connection_id)
        check_ws_url(url)
        now = now_ms()
        await self._run(
            self._client.put_item(
                TableName=self._table,
                Item={
                    "connection_id": {"S": connection_id},
                    "desired_state": {"S": STARTED},
                    "ws_url": {"S": url},
                    "last_seq": {"N": str(NO_CHECKPOINT)},
                    # 0, not absent: new connections must appear in the by-state-expiry GSI.
                    "lease_expires_at_ms": {"N": "0"},
                    "lease_epoch": {"N": "0"},
                    "failures": {"N": "0"},
                    "updated_at_ms": {"N": str(now)},
                },
                ConditionExpression=COND_NEW,
            ),
            on_condition_failed=ConnectionExists(f"connection {connection_id!r} already exists"),
        )

    async def set_desired_state(self, connection_id: str, state: str) -> None:
        check_connection_id(connection_id)
        update = "SET desired_state = :state, updated_at_ms = :now"
        values: dict[str, Any] = {":state": {"S": state}, ":now": {"N": str(now_ms())}}
        if state == STARTED:
            # Starting again clears a failure so the connection gets a fresh chance.
            update += " REMOVE last_error"
        await self._existing(connection_id, update, values)

    async def stop(self, connection_id: str) -> None:
        await self.set_desired_state(connection_id, STOPPED)

    async def start(self, connection_id: str) -> None:
        await self.set_desired_state(connection_id, STARTED)

    async def remove(self, connection_id: str) -> None:
        check_connection_id(connection_id)
        await self._run(
            self._client.delete_item(
                TableName=self._table,
                Key={"connection_id": {"S": connection_id}},
                ConditionExpression=COND_EXISTS,
            ),
            on_condition_failed=UnknownConnection(connection_id),
        )

    async def show(self, connection_id: str) -> dict[str, Any]:
        check_connection_id(connection_id)
        response = await self._run(
            self._client.get_item(
                TableName=self._table, Key={"connection_id": {"S": connection_id}}, ConsistentRead=True
            )
        )
        item = response.get("Item")
        if not item:
            raise UnknownConnection(connection_id)
        return plain(item)

    async def list(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        start_key: dict[str, Any] | None = None
        while True:
            kwargs: dict[str, Any] = {"TableName": self._table, "ConsistentRead": True}
            if start_key:
                kwargs["ExclusiveStartKey"] = start_key
            response = await self._run(self._client.scan(**kwargs))
            items.extend(
                plain(item)
                for item in response.get("Items", [])
                if not item["connection_id"]["S"].startswith("worker#")
            )
            start_key = response.get("LastEvaluatedKey")
            if not start_key:
                break
        return sorted(items, key=lambda item: str(item.get("connection_id")))

    async def _existing(self, connection_id: str, update: str, values: dict[str, Any]) -> None:
        await self._run(
            self._client.update_item(
                TableName=self._table,
                Key={"connection_id": {"S": connection_id}},
                UpdateExpression=update,
                ConditionExpression=COND_EXISTS,
                ExpressionAttributeValues=values,
            ),
            on_condition_failed=UnknownConnection(connection_id),
        )

    async def describe(self) -> None:
        """Raise TableMissing if the table does not exist."""
        await self._run(self._client.describe_table(TableName=self._table))


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


__all__ = [
    "ConnectionExists",
    "ConnectionItem",
    "LeaseTableAdmin",
    "TableMissing",
    "UnknownConnection",
    "check_ws_url",
    "plain",
]
