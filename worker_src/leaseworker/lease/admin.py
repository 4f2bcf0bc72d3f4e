"""Operator actions on the lease table: create it, add, stop, start, remove and list connections.

These are the control plane (docs/design.md §6). They never touch a live lease's owner or epoch.

`remove` writes a tombstone and `add` resurrects one, keeping the epoch: why that is sound is in
`lease.removal`. The operator's reads are in `lease.table_view`, and what these actions refuse
(an existing id, an unknown one, a bad URL) in `lease.admin_errors`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from botocore.exceptions import ClientError

from leaseworker.lease.admin_errors import ConnectionExists, UnknownConnection, check_ws_url
from leaseworker.lease.connection_expressions import cursor_names
from leaseworker.lease.connection_writes import (
    ItemUpdate,
    add_update,
    feed_update,
    state_update,
)
from leaseworker.lease.dynamodb import CONDITION_FAILED, call_with_deadline, translate_client_error
from leaseworker.lease.errors import TableMissing
from leaseworker.lease.model import (
    DEFAULT_PROTOCOL,
    STARTED,
    STOPPED,
    ConnectionItem,
    check_connection_id,
)
from leaseworker.lease.removal import (
    COND_SESSION_FENCED,
    ExpiryWatch,
    NotRemovable,
    ReleaseTimeout,
    Tombstone,
    remove_forced,
    try_remove,
)
from leaseworker.lease.table_view import Snapshot, TableView, plain
from leaseworker.lease.vocabulary import TABLE_SCHEMA, TTL_ATTRIBUTE, WORKER_KEY_PREFIX
from leaseworker.settings import DEFAULT_LEASE_SECONDS

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb import DynamoDBClient


class _TableExists(Exception):
    pass


class _ConditionLost(Exception):
    pass


_TRANSACTION_CANCELED = "TransactionCanceledException"
_ADMIN_PASSTHROUGH = frozenset({CONDITION_FAILED, _TRANSACTION_CANCELED, "ResourceInUseException"})


class LeaseTableAdmin:
    def __init__(
        self,
        client: DynamoDBClient,
        table_name: str,
        *,
        call_timeout: float = 10.0,
        max_clock_skew_ms: int = 1000,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
    ) -> None:
        self._lease_seconds = lease_seconds
        self._client = client
        self._table = table_name
        self._timeout = call_timeout
        self._skew_ms = max_clock_skew_ms  # not for removal: it judges expiry on its own clock
        self._view = TableView(client, table_name, self._run)

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
        """Create the table, its two GSIs and TTL on `purge_at`; False if it already exists."""
        try:
            await self._run(
                self._client.create_table(
                    TableName=self._table,
                    BillingMode="PAY_PER_REQUEST",
                    **TABLE_SCHEMA,  # type: ignore[arg-type]
                )
            )
        except _TableExists:
            return False
        waiter = self._client.get_waiter("table_exists")
        await self._run(waiter.wait(TableName=self._table, WaiterConfig={"Delay": 1, "MaxAttempts": 30}))
        await self._run(
            self._client.update_time_to_live(
                TableName=self._table,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
            )
        )
        return True

    async def add(
        self,
        connection_id: str,
        url: str,
        *,
        protocol: str = DEFAULT_PROTOCOL,
        protocol_config: str | None = None,
        preset: str | None = None,
        state: str = STARTED,
    ) -> None:
        """A new connection (STARTED unless `state` says otherwise); over a tombstone, the same id
        again with its epoch kept.

        `protocol_config` is JSON text the caller has validated (cli/feeds.py); `url` is then the
        config's URL template, shown by `list` (its secrets are references, not values)."""
        check_connection_id(connection_id)
        check_ws_url(url)
        write = add_update(
            connection_id, url, protocol=protocol, protocol_config=protocol_config, preset=preset, state=state
        )
        await self._run(
            self._client.update_item(**write.request(self._table)),
            on_condition_failed=ConnectionExists(f"connection {connection_id!r} already exists"),
        )

    async def update_feed(
        self,
        connection_id: str,
        url: str,
        *,
        protocol: str,
        protocol_config: str | None,
        preset: str | None,
        state: str,
    ) -> None:
        """Set a live connection's feed and desired state (`connections apply`) in one write; its
        lease and checkpoint are left alone. UnknownConnection if it is absent."""
        check_connection_id(connection_id)
        check_ws_url(url)
        write = feed_update(
            connection_id, url, protocol=protocol, protocol_config=protocol_config, preset=preset, state=state
        )
        await self._existing_write(write)

    async def set_desired_state(self, connection_id: str, state: str) -> None:
        check_connection_id(connection_id)
        await self._existing_write(state_update(connection_id, state))

    async def transact(self, writes: list[ItemUpdate]) -> bool:
        """All of `writes` (at most 100, distinct items) in one TransactWriteItems, or none: False
        when it was cancelled (a condition failed, or a write conflicted), for the caller to
        write them one by one. botocore fills in the idempotency token, so its retry of a call
        whose reply was lost cannot apply it twice."""
        try:
            await self._run(
                self._client.transact_write_items(
                    TransactItems=[{"Update": cast(Any, write.request(self._table))} for write in writes]
                ),
                on_condition_failed=_ConditionLost(),  # TransactionCanceledException
            )
        except _ConditionLost:
            return False
        return True

    async def stop(self, connection_id: str) -> None:
        await self.set_desired_state(connection_id, STOPPED)

    async def start(self, connection_id: str) -> None:
        await self.set_desired_state(connection_id, STARTED)

    async def remove(self, connection_id: str) -> None:
        """Tombstone a STOPPED, released connection; NotRemovable says why not otherwise."""
        check_connection_id(connection_id)
        held = await try_remove(self, connection_id, ExpiryWatch(self._lease_seconds))
        if held is not None:
            raise NotRemovable(connection_id, held)

    async def remove_forced(
        self,
        connection_id: str,
        *,
        hint: Callable[[], Awaitable[None]],
        wait_seconds: float,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        """Stop it, send `hint`, wait (bounded) for the release, then tombstone it (`lease.removal`)."""
        check_connection_id(connection_id)
        await remove_forced(
            self,
            connection_id,
            lease_seconds=self._lease_seconds,
            hint=hint,
            wait_seconds=wait_seconds,
            progress=progress,
        )

    async def write_tombstone(self, connection_id: str, tombstone: Tombstone) -> bool:
        key = {"connection_id": {"S": connection_id}}
        try:
            if tombstone.fenced_session is None:
                await self._run(
                    self._client.update_item(
                        TableName=self._table,
                        Key=key,
                        UpdateExpression=tombstone.update,
                        ConditionExpression=tombstone.condition,
                        ExpressionAttributeValues=tombstone.values,
                        **cursor_names(tombstone.update),
                    ),
                    on_condition_failed=_ConditionLost(),
                )
            else:
                # The session's fence and the tombstone in one transaction: no window between them.
                session = {"connection_id": {"S": f"{WORKER_KEY_PREFIX}{tombstone.fenced_session}"}}
                update: Any = {
                    "TableName": self._table,
                    "Key": key,
                    "UpdateExpression": tombstone.update,
                    "ConditionExpression": tombstone.condition,
                    "ExpressionAttributeValues": tombstone.values,
                    **cursor_names(tombstone.update),
                }
                await self._run(
                    self._client.transact_write_items(
                        TransactItems=[
                            {
                                "ConditionCheck": {
                                    "TableName": self._table,
                                    "Key": session,
                                    "ConditionExpression": COND_SESSION_FENCED,
                                }
                            },
                            {"Update": update},
                        ]
                    ),
                    on_condition_failed=_ConditionLost(),
                )
        except _ConditionLost:
            return False
        return True

    async def show(self, connection_id: str) -> dict[str, Any]:
        """One connection with its effective checkpoint; UnknownConnection if absent or removed."""
        check_connection_id(connection_id)
        shown = await self._view.connection(connection_id)
        if shown is None:
            raise UnknownConnection(connection_id)
        return shown

    async def raw_item(self, key: str) -> dict[str, Any] | None:
        """Any item by key, a worker's own included (`worker#<id>`), as plain values."""
        return await self._view.raw_item(key)

    async def list(self) -> list[dict[str, Any]]:
        """Every connection (tombstones hidden), each with its effective `checkpoint`."""
        connections, _ = await self._view.snapshot()
        return connections

    async def snapshot(self) -> Snapshot:
        return await self._view.snapshot()

    async def _existing_write(self, write: ItemUpdate) -> None:
        await self._run(
            self._client.update_item(**write.request(self._table)),
            on_condition_failed=UnknownConnection(write.connection_id),
        )

    async def describe(self) -> None:
        """Raise TableMissing if the table does not exist."""
        await self._run(self._client.describe_table(TableName=self._table))


__all__ = [
    "ConnectionItem",
    "LeaseTableAdmin",
    "NotRemovable",
    "ReleaseTimeout",
    "Snapshot",
    "TableMissing",
    "plain",
]
