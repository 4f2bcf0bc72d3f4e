"""For consumers of the sink: read a whole Kinesis stream in shard order.

`read_stream` reads a whole stream in shard order (parents before children), the order in which
Kinesis accepted the records: small tools, tests and the docs use it; a production consumer uses
the KCL, Lambda or its own shard iterators and only the filter (leaseworker.consumer).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from types_aiobotocore_kinesis import KinesisClient
    from types_aiobotocore_kinesis.literals import ShardIteratorTypeType
    from types_aiobotocore_kinesis.type_defs import ShardTypeDef

GET_RECORDS_LIMIT: Final = 10_000  # the most GetRecords returns per call


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """One Kinesis record: where it sits in its shard, and the sink record it carries."""

    shard_id: str
    sequence_number: str
    partition_key: str
    record: dict[str, Any]


def shard_order(shards: list[ShardTypeDef]) -> list[str]:
    """Shard ids with every parent (and adjacent parent) before its children, else by id."""
    by_id = {shard["ShardId"]: shard for shard in shards}
    ordered: list[str] = []
    placed: set[str] = set()

    def place(shard_id: str) -> None:
        if shard_id in placed or shard_id not in by_id:
            return
        placed.add(shard_id)
        shard = by_id[shard_id]
        for parent in (shard.get("ParentShardId"), shard.get("AdjacentParentShardId")):
            if parent:
                place(parent)
        ordered.append(shard_id)

    for shard_id in sorted(by_id):
        place(shard_id)
    return ordered


async def read_stream(
    client: KinesisClient, stream_name: str, *, iterator_type: ShardIteratorTypeType = "TRIM_HORIZON"
) -> AsyncIterator[StreamRecord]:
    """Every record now in the stream, shard by shard in shard order, then stop: each shard is
    read up to its tip as first reached, so records written meanwhile may or may not be included.

    Within a shard this is the order in which Kinesis accepted the records, which for one
    connection (one partition key, hence one shard between reshards) is the single arbiter that
    S1 is judged at (docs/design.md §2c).
    """
    shards: list[ShardTypeDef] = []
    token: str | None = None
    while True:
        page = await (
            client.list_shards(NextToken=token) if token else client.list_shards(StreamName=stream_name)
        )
        shards.extend(page["Shards"])
        token = page.get("NextToken")
        if not token:
            break
    for shard_id in shard_order(shards):
        iterator: str | None = (
            await client.get_shard_iterator(
                StreamName=stream_name,
                ShardId=shard_id,
                ShardIteratorType=iterator_type,
            )
        )["ShardIterator"]
        while iterator:
            response = await client.get_records(ShardIterator=iterator, Limit=GET_RECORDS_LIMIT)
            for entry in response["Records"]:
                yield StreamRecord(
                    shard_id, entry["SequenceNumber"], entry["PartitionKey"], json.loads(entry["Data"])
                )
            caught_up = response.get("MillisBehindLatest", 0) == 0
            if caught_up and len(response["Records"]) < GET_RECORDS_LIMIT:
                # At the shard's tip as of this call. Waiting for an empty page instead chased a
                # fleet that was still writing: each page brought the few records written during
                # the last call, and a system test's read never ended (seen: over 3 minutes).
                break
            iterator = response.get("NextShardIterator")
