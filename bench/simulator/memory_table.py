"""The lease table in memory: items by `connection_id`, and its two KEYS_ONLY GSIs kept in order.

An index partition keeps one bucket of ids per distinct sort-key value plus the sorted list of
those values, so moving an entry (a renewal rewrites `lease_expires_at_ms`) is O(1) set work and
a range query walks only the buckets it returns. Entries with equal sort keys are returned in
`connection_id` order (DynamoDB leaves that order undefined). The indexes are those of
bench.capacity.INDEXES, which mirror lease/admin.py's table definition.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any

from bench.capacity import INDEXES, TABLE_KEY
from bench.simulator.expressions import Condition, Item, Names, Values, number
from leaseworker.lease.vocabulary import INDEX_BY_OWNER

SortKey = Any  # int | Decimal | str; None for an index without a sort key


class Partition:
    def __init__(self) -> None:
        self.buckets: dict[SortKey, set[str]] = {}
        self.order: list[SortKey] = []
        self._sorted: dict[SortKey, list[str]] = {}
        self.size = 0

    def add(self, key: SortKey, cid: str) -> None:
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = set()
            if key is not None:
                bisect.insort(self.order, key)
            else:
                self.order = [None]
        bucket.add(cid)
        self._sorted.pop(key, None)
        self.size += 1

    def discard(self, key: SortKey, cid: str) -> None:
        bucket = self.buckets[key]
        bucket.remove(cid)
        self._sorted.pop(key, None)
        self.size -= 1
        if not bucket:
            del self.buckets[key]
            if key is not None:
                del self.order[bisect.bisect_left(self.order, key)]
            else:
                self.order = []

    def walk(
        self,
        start: tuple[SortKey, str] | None,
        accept: Condition | None,
        sort_name: str | None,
        values: Values,
        names: Names,
    ) -> Iterator[tuple[SortKey, str]]:
        """Entries in index order after `start` (exclusive) whose sort key passes `accept`.

        A key condition on a sort key selects one contiguous range (=, <, <=, >, >=, BETWEEN,
        begins_with), so the walk ends at the first key that fails after one that passed."""
        first = 0
        if start is not None and start[0] is not None:
            first = bisect.bisect_left(self.order, start[0])
        matched = False
        for key in self.order[first:]:
            if (
                accept is not None
                and sort_name is not None
                and not accept({sort_name: _wire(key)}, values, names)
            ):
                if matched:
                    return
                continue
            matched = True
            ids = self._sorted.get(key)
            if ids is None:
                ids = self._sorted[key] = sorted(self.buckets[key])
            begin = 0
            if start is not None and start[0] == key:
                begin = bisect.bisect_right(ids, start[1])
            for cid in ids[begin:]:
                yield key, cid


def _wire(key: SortKey) -> dict[str, str]:
    return {"S": key} if isinstance(key, str) else {"N": str(key)}


def sort_value(value: dict[str, Any]) -> SortKey:
    ((tag, inner),) = value.items()
    return number(inner) if tag == "N" else inner


class Index:
    def __init__(self, name: str, partition: str, sort: str | None) -> None:
        self.name = name
        self.partition_name = partition
        self.sort_name = sort
        self.partitions: dict[str, Partition] = {}

    def entry_key(self, item: Item | None) -> tuple[str, SortKey] | None:
        if not item or self.partition_name not in item:
            return None
        if self.sort_name is None:
            return str(next(iter(item[self.partition_name].values()))), None
        if self.sort_name not in item:
            return None
        return str(next(iter(item[self.partition_name].values()))), sort_value(item[self.sort_name])

    def move(self, cid: str, before: Item | None, after: Item | None) -> None:
        old, new = self.entry_key(before), self.entry_key(after)
        if old == new:
            return
        if old is not None:
            self.partitions[old[0]].discard(old[1], cid)
        if new is not None:
            self.partitions.setdefault(new[0], Partition()).add(new[1], cid)


class Table:
    """One lease table: items keyed by `connection_id` (S), with the indexes of capacity.INDEXES."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.items: dict[str, Item] = {}
        self.indexes = {spec[0]: Index(*spec) for spec in INDEXES}

    @staticmethod
    def key_of(key: dict[str, Any]) -> str:
        if set(key) != set(TABLE_KEY) or "S" not in key[TABLE_KEY[0]]:
            raise KeyError(f"the key must be exactly {TABLE_KEY} (S), got {key}")
        return str(key[TABLE_KEY[0]]["S"])

    def store(self, cid: str, before: Item | None, after: Item | None) -> None:
        if after is None:
            self.items.pop(cid, None)
        else:
            self.items[cid] = after
        for index in self.indexes.values():
            index.move(cid, before, after)

    def owned_by(self, owner: str) -> int:
        """How many items name `owner` (from the by-owner index; for the simulator's samples)."""
        partition = self.indexes[INDEX_BY_OWNER].partitions.get(owner)
        return partition.size if partition else 0


class Database:
    """The tables of one simulated DynamoDB endpoint (region), shared by every worker's client."""

    def __init__(self) -> None:
        self.tables: dict[str, Table] = {}

    def create_table(self, name: str) -> Table:
        table = self.tables[name] = Table(name)
        return table
