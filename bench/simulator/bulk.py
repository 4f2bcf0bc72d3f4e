"""The reduced-fidelity path for connection mode's per-lease writes (`fidelity="batched"`).

At 100,000 connections, connection mode sends 20,000 renewals and 20,000 checkpoints per second;
through the real store and the full client each costs about 50 µs of CPU, too slow for a run of
minutes. In a batch of leases that fall due together, the first goes through the real
`Ownership` method and the full client; the rest are applied here straight to the table: the
same condition (owner, epoch, and STARTED or `last_seq < :seq`) checked on each item, the same
attributes written, the index entry moved, and each charged the price the first one was
measured at (the items have the same shape). A lease whose check fails is returned, and the
caller sends it through the real path, so every refusal has the real outcome.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.simulator.memory_dynamodb import MemoryDynamoDB
from leaseworker.lease.model import STARTED, Lease
from leaseworker.lease.vocabulary import INDEX_BY_STATE_EXPIRY

RENEW_KIND = "UpdateItem connection SET lease_expires_at_ms"
CHECKPOINT_KIND = "UpdateItem connection SET last_seq"


def renew_rest(
    client: MemoryDynamoDB, table_name: str, leases: Sequence[Lease], expires_ms: int
) -> list[Lease]:
    """SET lease_expires_at_ms under `lease_owner = :me AND lease_epoch = :epoch AND STARTED`."""
    table = client.database.tables[table_name]
    index = table.indexes[INDEX_BY_STATE_EXPIRY].partitions.get(STARTED)
    new_value = {"N": str(expires_ms)}
    refused: list[Lease] = []
    for lease in leases:
        item = table.items.get(lease.connection_id)
        if (
            index is None
            or item is None
            or item.get("lease_owner", {}).get("S") != lease.owner
            or item.get("lease_epoch", {}).get("N") != str(lease.epoch)
            or item.get("desired_state", {}).get("S") != STARTED
        ):
            refused.append(lease)
            continue
        old = item.get("lease_expires_at_ms")
        item["lease_expires_at_ms"] = new_value
        if old is not None:
            index.discard(int(old["N"]), lease.connection_id)
        index.add(expires_ms, lease.connection_id)
    done = len(leases) - len(refused)
    if done:
        client.meter.charge(RENEW_KIND, wru=client.last_price.get(RENEW_KIND, 3.0) * done, calls=done)
    return refused


def checkpoint_rest(
    client: MemoryDynamoDB, table_name: str, entries: Sequence[tuple[Lease, int]], now_ms: int
) -> list[Lease]:
    """SET last_seq, updated_at_ms under owner, epoch and `last_seq < :seq`."""
    table = client.database.tables[table_name]
    now_value = {"N": str(now_ms)}
    refused: list[Lease] = []
    for lease, seq in entries:
        item = table.items.get(lease.connection_id)
        if (
            item is None
            or item.get("lease_owner", {}).get("S") != lease.owner
            or item.get("lease_epoch", {}).get("N") != str(lease.epoch)
            or ("last_seq" in item and int(item["last_seq"]["N"]) >= seq)
        ):
            refused.append(lease)
            continue
        item["last_seq"] = {"N": str(seq)}
        item["updated_at_ms"] = now_value
    done = len(entries) - len(refused)
    if done:
        price = client.last_price.get(CHECKPOINT_KIND, 1.0)
        client.meter.charge(CHECKPOINT_KIND, wru=price * done, calls=done)
    return refused
