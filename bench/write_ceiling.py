"""DynamoDB Local's ceiling for claim-shaped writes, measured on the machine and server at hand.

P6 (bench/cold_start.py) reports claims per second against this. The loop is the bare claim:
one conditional UpdateItem per item, the same update and condition shape as a free claim
(lease/held_store.py: owner, the session marker, epoch + 1, moving both GSI keys), on a table
with the lease table's schema and indexes, items added as `connections add` adds them. PROCESSES
processes (as many as the workers), each one asyncio loop with CONCURRENCY writes in flight,
each claiming its own slice of the items: no contention, no reads, no backoff, nothing else.
What it cannot claim per second, no fleet can.

    .venv/bin/python -m bench.write_ceiling --endpoint http://127.0.0.1:PORT [--items 4000]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import time
from typing import Any

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.vocabulary import SESSION_HELD
from leaseworker_dev.local.services import local_dynamodb

TABLE = "leaseworker-ceiling"
PROCESSES = 4
CONCURRENCY = 32  # as the acquirer's CLAIM_CONCURRENCY
ADD_CONCURRENCY = 32


async def _prepare(endpoint: str, items: int) -> None:
    async with local_dynamodb(endpoint) as client:
        admin = LeaseTableAdmin(client, TABLE)
        await admin.create_table()
        gate = asyncio.Semaphore(ADD_CONCURRENCY)

        async def add(index: int) -> None:
            async with gate:
                await admin.add(f"ceiling-{index:06d}", "ws://127.0.0.1:1/none")

        async with asyncio.TaskGroup() as group:
            for index in range(items):
                group.create_task(add(index))


async def _claim_slice(endpoint: str, ids: list[str], me: str) -> tuple[int, int]:
    """Claim every id once; (claimed, refused)."""
    claimed = refused = 0
    async with local_dynamodb(endpoint) as client:
        gate = asyncio.Semaphore(CONCURRENCY)

        async def claim(connection_id: str) -> None:
            nonlocal claimed, refused
            async with gate:
                try:
                    await client.update_item(
                        TableName=TABLE,
                        Key={"connection_id": {"S": connection_id}},
                        UpdateExpression=(
                            "SET lease_owner = :me, lease_expires_at_ms = :held, "
                            "lease_epoch = lease_epoch + :one, updated_at_ms = :now"
                        ),
                        ConditionExpression="desired_state = :started AND lease_expires_at_ms < :now",
                        ExpressionAttributeValues={
                            ":me": {"S": me},
                            ":held": {"N": str(SESSION_HELD)},
                            ":one": {"N": "1"},
                            ":now": {"N": str(time.time_ns() // 1_000_000)},
                            ":started": {"S": "STARTED"},
                        },
                        ReturnValues="ALL_OLD",
                        ReturnValuesOnConditionCheckFailure="ALL_OLD",
                    )
                    claimed += 1
                except client.exceptions.ConditionalCheckFailedException:
                    refused += 1

        async with asyncio.TaskGroup() as group:
            for connection_id in ids:
                group.create_task(claim(connection_id))
    return claimed, refused


def _process(endpoint: str, ids: list[str], me: str, start: Any, queue: Any) -> None:
    start.wait()
    began = time.monotonic()
    claimed, refused = asyncio.run(_claim_slice(endpoint, ids, me))
    queue.put((claimed, refused, began, time.monotonic()))


def measure(endpoint: str, items: int = 4000, processes: int = PROCESSES) -> dict[str, Any]:
    """Writes per second of `processes` bare claim loops over `items` fresh items."""
    asyncio.run(_prepare(endpoint, items))
    ids = [f"ceiling-{index:06d}" for index in range(items)]
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    queue = context.Queue()
    workers = [
        context.Process(target=_process, args=(endpoint, ids[n::processes], f"ceiling{n}", start, queue))
        for n in range(processes)
    ]
    for worker in workers:
        worker.start()
    time.sleep(2.0)  # every process imported and waiting
    start.set()
    results = [queue.get(timeout=300) for _ in workers]
    for worker in workers:
        worker.join(timeout=30)
    claimed = sum(r[0] for r in results)
    seconds = max(r[3] for r in results) - min(r[2] for r in results)
    return {
        "items": items,
        "processes": processes,
        "concurrency": CONCURRENCY,
        "claimed": claimed,
        "refused": sum(r[1] for r in results),
        "seconds": seconds,
        "writes_per_s": claimed / seconds if seconds > 0 else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--items", type=int, default=4000)
    args = parser.parse_args()
    print(measure(args.endpoint, args.items))


if __name__ == "__main__":
    main()
