"""The operator's writes that need more than one item at once, against DynamoDB Local and the
in-memory client (conftest.py): `LeaseTableAdmin.transact` is all or nothing."""

from __future__ import annotations

import pytest
from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.connection_writes import ItemUpdate, state_update
from leaseworker.lease.model import STARTED, STOPPED

URL = "ws://127.0.0.1:9/feeds/x"


async def states(admin: LeaseTableAdmin, *ids: str) -> list[str]:
    return [str((await admin.show(cid))["desired_state"]) for cid in ids]


async def test_transact_applies_every_write_or_none(ddb: DynamoDBClient, table: str) -> None:
    admin = LeaseTableAdmin(ddb, table)
    for cid in ("a", "b"):
        await admin.add(cid, URL)
    # "nobody" does not exist: its condition fails, so "a" and "b" stay as they were.
    refused = [state_update(cid, STOPPED) for cid in ("a", "b", "nobody")]
    assert await admin.transact(refused) is False
    assert await states(admin, "a", "b") == [STARTED, STARTED]
    assert await admin.transact([state_update(cid, STOPPED) for cid in ("a", "b")]) is True
    assert await states(admin, "a", "b") == [STOPPED, STOPPED]


async def test_transact_refuses_an_item_over_400_kb_and_applies_nothing(
    ddb: DynamoDBClient, table: str
) -> None:
    admin = LeaseTableAdmin(ddb, table)
    for cid in ("a", "b"):
        await admin.add(cid, URL)
    big = ItemUpdate(
        "b", "SET padding = :pad", "attribute_exists(connection_id)", {":pad": {"S": "x" * 410_000}}
    )
    with pytest.raises(Exception, match=r"(?i)item size"):
        await admin.transact([state_update("a", STOPPED), big])
    assert await states(admin, "a", "b") == [STARTED, STARTED]
    assert "padding" not in await admin.show("b")
