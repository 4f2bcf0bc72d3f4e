"""The lease table's change stream as S3's complete record (chaos/table_history.py): every write
that moves a checkpoint back is found, however soon a later write covers it."""

from __future__ import annotations

from typing import Any

from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.chaos.table_history import checkpoint_regressions, enable, read_all


def _conn(seq: int, epoch: int = 1, owner: str = "w1") -> dict[str, Any]:
    return {
        "connection_id": {"S": "c-01"},
        "lease_owner": {"S": owner},
        "lease_epoch": {"N": str(epoch)},
        "last_seq": {"N": str(seq)},
    }


def _ckpt(entries: dict[str, tuple[int, int]]) -> dict[str, Any]:
    return {
        "connection_id": {"S": "worker#w2#ckpt"},
        "checkpoints": {"M": {cid: {"L": [{"N": str(e)}, {"N": str(s)}]} for cid, (e, s) in entries.items()}},
    }


def test_only_writes_that_move_a_checkpoint_back_are_violations() -> None:
    records: list[dict[str, Any]] = [
        {"SequenceNumber": "1", "NewImage": _conn(5)},  # insert
        {"SequenceNumber": "2", "OldImage": _conn(5), "NewImage": _conn(9, epoch=2, owner="w2")},
        {"SequenceNumber": "3", "OldImage": _conn(9, epoch=2, owner="w2"), "NewImage": _conn(6, 2, "w2")},
        {"SequenceNumber": "4", "OldImage": _ckpt({"c-02": (3, 40)}), "NewImage": _ckpt({"c-02": (3, 41)})},
        {"SequenceNumber": "5", "OldImage": _ckpt({"c-02": (3, 41)}), "NewImage": _ckpt({"c-02": (4, 2)})},
        {"SequenceNumber": "6", "OldImage": _ckpt({"c-02": (4, 7)}), "NewImage": _ckpt({"c-02": (4, 6)})},
        {"SequenceNumber": "7", "OldImage": _ckpt({"c-02": (4, 7)}), "NewImage": _ckpt({})},  # dropped
    ]
    assert checkpoint_regressions(records) == [
        "S3 c-01: last_seq written back from 9 to 6 (item at epoch 2, w2)",
        "S3 c-02: w2's batched checkpoint at epoch 4 written back from 7 to 6",
    ]


async def test_a_late_write_covered_at_once_is_still_in_the_history(
    ddb: DynamoDBClient, table: str, dynamodb_endpoint: str
) -> None:
    arn = await enable(dynamodb_endpoint, table)
    key = {"connection_id": {"S": "c-01"}}
    await ddb.put_item(TableName=table, Item=_conn(5))
    for seq in (9, 6, 12):  # 6: a deposed owner's late checkpoint, covered by the next write
        await ddb.update_item(
            TableName=table,
            Key=key,
            UpdateExpression="SET last_seq = :seq",
            ExpressionAttributeValues={":seq": {"N": str(seq)}},
        )
    item = await ddb.get_item(TableName=table, Key=key, ConsistentRead=True)
    assert item["Item"]["last_seq"]["N"] == "12"  # a reading now sees nothing wrong

    writes = await read_all(dynamodb_endpoint, arn)
    assert [w["NewImage"]["last_seq"]["N"] for w in writes] == ["5", "9", "6", "12"]
    assert checkpoint_regressions(writes) == [
        "S3 c-01: last_seq written back from 9 to 6 (item at epoch 1, w1)"
    ]
