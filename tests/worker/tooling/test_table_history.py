"""The lease table's change stream as S3's complete record (chaos/table_history.py): every write
that moves a checkpoint back is found, however soon a later write covers it."""

from __future__ import annotations

from typing import Any

from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker_dev.chaos.table_history import checkpoint_regressions, enable, read_all


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


def _held(cid: str, seq: int, epoch: int, owner: str | None) -> dict[str, Any]:
    item: dict[str, Any] = {
        "connection_id": {"S": cid},
        "lease_epoch": {"N": str(epoch)},
        "last_seq": {"N": str(seq)},
    }
    if owner is not None:
        item["lease_owner"] = {"S": owner}
    return item


def _ckpt_of(worker: str, entries: dict[str, tuple[int, int]]) -> dict[str, Any]:
    return {
        "connection_id": {"S": f"worker#{worker}#ckpt"},
        **{k: v for k, v in _ckpt(entries).items() if k != "connection_id"},
    }


def _history(*images: dict[str, Any]) -> list[dict[str, Any]]:
    """Writes in order, each with the previous image of its key as OldImage."""
    last: dict[str, dict[str, Any]] = {}
    records: list[dict[str, Any]] = []
    for n, image in enumerate(images, 1):
        key = image["connection_id"]["S"]
        record = {"SequenceNumber": str(n), "NewImage": image}
        if key in last:
            record["OldImage"] = last[key]
        last[key] = image
        records.append(record)
    return records


def test_an_effective_checkpoint_lost_across_a_takeover_is_a_violation() -> None:
    """w1 holds c-01 at epoch 5 (claimed at last_seq 10) and checkpoints 40 into its entry. A
    takeover that resumes from the item's 10 instead of 40 moves the effective checkpoint back,
    though no single attribute moved back; one that writes max(10, 40) does not."""
    before = (_held("c-01", 10, 5, "w1"), _ckpt_of("w1", {"c-01": (5, 40)}))
    lost = _history(*before, _held("c-01", 10, 6, "w2"))
    kept = _history(*before, _held("c-01", 40, 6, "w2"))
    assert checkpoint_regressions(lost) == [
        "S3 c-01: effective checkpoint moved back from 40 to 10 across an owner change "
        "(w1 at epoch 5 -> w2 at epoch 6)"
    ]
    assert checkpoint_regressions(kept) == []
    released = _history(*before, _held("c-01", 38, 5, None))  # a release below the entry
    assert checkpoint_regressions(released) == [
        "S3 c-01: effective checkpoint moved back from 40 to 38 across an owner change "
        "(w1 at epoch 5 -> nobody at epoch 5)"
    ]


def test_an_entry_dropped_while_its_item_still_names_the_worker_is_a_violation() -> None:
    held = (_held("c-01", 10, 5, "w1"), _ckpt_of("w1", {"c-01": (5, 40), "c-02": (3, 7)}))
    dropped = _history(*held, _ckpt_of("w1", {"c-02": (3, 8)}))
    assert checkpoint_regressions(dropped) == [
        "S3 c-01: w1's checkpoint entry at epoch 5 (seq 40) dropped "
        "while the item still names w1 at that epoch"
    ]
    # Dropped after the release landed (the item no longer names w1): the protocol's order.
    after_release = _history(*held, _held("c-01", 40, 5, None), _ckpt_of("w1", {"c-02": (3, 8)}))
    assert checkpoint_regressions(after_release) == []
    # c-02 has no connection item here: nothing names w1, so its drop is not judged.
    assert checkpoint_regressions(_history(*held, _ckpt_of("w1", {"c-01": (5, 41)}))) == []
