"""Every write the lease table took, from its own change stream (DynamoDB Local supports them).

S3 says a checkpoint never moves backwards. The table sampler reads the table four times a second,
so a write that moves a checkpoint back and is overwritten within that time can pass unseen. A
late write is exactly that: a deposed owner's checkpoint lands after the new owner's and lasts
until the new owner's next one, a second later at the fast timings. The stream records the old
and the new image of every write, so `checkpoint_regressions` sees each one, per item and in the
order the table applied them:

- a connection item's `last_seq` lower than before;
- a worker's batched checkpoint entry (`worker#<id>#ckpt`, docs/design.md §2b) at the same epoch with
  a lower seq than before.

Both only ever move up in the protocol (COND_CHECKPOINT's `last_seq < :seq`, the held store's
`last_seq <= :resume`, the checkpoint item's writer counter), so each finding is a violation.

Replaying the writes in order also gives the table's state after each one, hence two more (issue 20):

- the EFFECTIVE checkpoint (max of the connection item's `last_seq` and its holder's entry at the
  item's epoch, docs/design.md §2b) lower after a write that changed the item's owner or epoch than
  before it: a takeover or a release that lost the holder's newer entry (review 2026-12-05, C1);
- an entry dropped from a worker's checkpoint item while the connection item still names that
  worker at the entry's epoch: its only fresh checkpoint gone while it holds the lease (C2, B).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

import aioboto3

from leaseworker.lease.checkpoint_store import entries_from
from leaseworker.lease.vocabulary import RESERVED_KEY_PREFIXES
from leaseworker_dev.chaos.observe import checkpoint_item_worker, session_item_worker
from leaseworker_dev.local.fleet import TABLE
from leaseworker_dev.local.services import LOCAL_CLIENT_OPTIONS, local_dynamodb

PAGE: Final = 1000  # GetRecords' most records per call

Record = Mapping[str, Any]  # one stream record's `dynamodb` part


async def enable(endpoint: str, table: str = TABLE) -> str:
    """Turn on the lease table's stream (old and new images); its ARN. Call before any worker
    starts, so that the stream holds every write of the run."""
    async with local_dynamodb(endpoint) as client:
        described = await client.update_table(
            TableName=table,
            StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
        )
    return str(described["TableDescription"]["LatestStreamArn"])


async def read_all(endpoint: str, stream_arn: str) -> list[Record]:
    """Every record of every shard, in the table's order of writes (sequence numbers)."""
    records: list[Record] = []
    async with aioboto3.Session().client(
        "dynamodbstreams", endpoint_url=endpoint, **LOCAL_CLIENT_OPTIONS
    ) as streams:
        shards: list[str] = []
        start: dict[str, str] = {}
        while True:
            described = (await streams.describe_stream(StreamArn=stream_arn, **start))["StreamDescription"]
            shards.extend(shard["ShardId"] for shard in described.get("Shards", []))
            last = described.get("LastEvaluatedShardId")
            if not last:
                break
            start = {"ExclusiveStartShardId": last}
        for shard in shards:
            got = await streams.get_shard_iterator(
                StreamArn=stream_arn, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
            )
            iterator: str | None = got.get("ShardIterator")
            while iterator:
                page = await streams.get_records(ShardIterator=iterator, Limit=PAGE)
                records.extend(record["dynamodb"] for record in page.get("Records", []))
                if not page.get("Records"):
                    break  # an open shard's end (a closed one ends with no next iterator)
                iterator = page.get("NextShardIterator")
    records.sort(key=lambda record: int(record["SequenceNumber"]))
    return records


def fenced_by_peers(records: Sequence[Record]) -> set[str]:
    """The workers whose session item a peer (or the supervisor) fenced during the run; a
    worker's own clean-exit fence (`fenced_by` itself, at the end of an ordered shutdown) is not
    one."""
    fenced: set[str] = set()
    for record in records:
        image = record.get("NewImage", {})
        worker = session_item_worker(str(image.get("connection_id", {}).get("S", "")))
        by = image.get("fenced_by", {}).get("S")
        if worker is not None and by is not None and by != worker:
            fenced.add(worker)
    return fenced


def checkpoint_regressions(records: Sequence[Record]) -> list[str]:
    """S3 violations: every write that moved a checkpoint back, and every effective checkpoint
    lost across an owner change or entry dropped while held (see the module docstring)."""
    return list(_regressions(records)) + list(_effective_losses(records))


def _effective_losses(records: Sequence[Record]) -> Iterator[str]:
    items: dict[str, tuple[str | None, int, int]] = {}  # cid -> (owner, epoch, last_seq)
    entries: dict[str, dict[str, tuple[int, int]]] = {}  # worker -> {cid: (epoch, seq)}

    def effective(cid: str) -> int:
        owner, epoch, last_seq = items[cid]
        entry = entries.get(owner or "", {}).get(cid)
        return max(last_seq, entry[1] if entry is not None and entry[0] == epoch else -1)

    for record in records:
        new, old = record.get("NewImage"), record.get("OldImage")
        image = new if new is not None else old
        if image is None:
            continue
        key = str(image["connection_id"]["S"])
        worker = checkpoint_item_worker(key)
        if worker is not None:
            after = entries_from(dict(new)) if new is not None else {}
            for cid, (epoch, seq) in sorted(entries.get(worker, {}).items()):
                if cid in after and after[cid][0] >= epoch:
                    continue
                owner, item_epoch, _ = items.get(cid, (None, -1, -1))
                if owner == worker and item_epoch == epoch:
                    yield (
                        f"S3 {cid}: {worker}'s checkpoint entry at epoch {epoch} (seq {seq}) dropped "
                        f"while the item still names {worker} at that epoch"
                    )
            entries[worker] = after
            continue
        if key.startswith(RESERVED_KEY_PREFIXES) or new is None or "removed_at_ms" in new:
            items.pop(key, None)
            continue
        before = effective(key) if key in items else None
        was = items.get(key)
        owner = new.get("lease_owner", {}).get("S")
        epoch = int(new.get("lease_epoch", {}).get("N", "0"))
        items[key] = (owner, epoch, int(new.get("last_seq", {}).get("N", "-1")))
        if was is None or before is None or was[:2] == (owner, epoch):
            continue
        if items[key][2] < was[2]:
            continue  # the item's own last_seq went back: reported as such by _regressions
        now = effective(key)
        if now < before:
            yield (
                f"S3 {key}: effective checkpoint moved back from {before} to {now} across an owner "
                f"change ({was[0] or 'nobody'} at epoch {was[1]} -> {owner or 'nobody'} at epoch {epoch})"
            )


def _regressions(records: Sequence[Record]) -> Iterator[str]:
    for record in records:
        old, new = record.get("OldImage"), record.get("NewImage")
        if old is None or new is None:
            continue  # an insert or a delete moves no checkpoint back
        key = str(new["connection_id"]["S"])
        worker = checkpoint_item_worker(key)
        if worker is not None:
            before, after = entries_from(dict(old)), entries_from(dict(new))
            for cid, (epoch, seq) in sorted(after.items()):
                entry = before.get(cid)
                if entry is not None and entry[0] == epoch and seq < entry[1]:
                    yield (
                        f"S3 {cid}: {worker}'s batched checkpoint at epoch {epoch} "
                        f"written back from {entry[1]} to {seq}"
                    )
        elif not key.startswith(RESERVED_KEY_PREFIXES) and "last_seq" in old and "last_seq" in new:
            was, now = int(old["last_seq"]["N"]), int(new["last_seq"]["N"])
            if now < was:
                epoch = new.get("lease_epoch", {}).get("N", "?")
                owner = new.get("lease_owner", {}).get("S", "nobody")
                yield f"S3 {key}: last_seq written back from {was} to {now} (item at epoch {epoch}, {owner})"
