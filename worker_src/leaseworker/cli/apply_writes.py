"""The writes of `connections apply`: bounded concurrency, one conditional write per connection.

`write_changes` runs the plan's changes as transactions of up to 100 conditional writes, at most
`concurrency` in flight (a pool of tasks taking from one iterator). A change that fails on its
own (the item changed since the table was read, a value DynamoDB refuses) is one failure line
and the rest go on; a failure of
the table itself (unreachable, missing, throttled past the SDK's retries) stops the pool and is
raised, for one line.

`prune_held` removes the connections the file no longer lists once they are stopped and released,
with `lease.removal`'s rules and its single-attempt `try_remove`: it polls every pending
connection until each is removed or `wait_seconds` have passed; what is still held then stays
STOPPED and is reported.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import TextIO, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress

from leaseworker.cli.apply_plan import Change, feed_differences
from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.lease.admin_errors import ConnectionExists, UnknownConnection
from leaseworker.lease.connection_writes import (
    TRANSACT_MAX,
    ItemUpdate,
    add_update,
    feed_update,
    state_update,
)
from leaseworker.lease.errors import StoreRejected
from leaseworker.lease.model import STOPPED
from leaseworker.lease.removal import WAIT_POLL_SECONDS, ExpiryWatch, Held, try_remove

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class WriteFailure:
    connection_id: str
    line: str


class Progress:
    """A progress bar on stderr when it is a terminal; nothing when it is piped or a file."""

    def __init__(self, bar: RichProgress | None, total: int) -> None:
        self._bar = bar
        self._task = bar.add_task("applying", total=total) if bar is not None else None

    @classmethod
    def on_terminal(cls, stream: TextIO, *, total: int) -> Progress:
        if not stream.isatty():
            return cls(None, total)
        bar = RichProgress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(file=stream),
            transient=True,
        )
        return cls(bar, total)

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.advance(self._task, steps)

    def describe(self, text: str) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, description=text)

    def __enter__(self) -> Progress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.stop()


# A change's own failure: the item moved under us, or DynamoDB refused this one write.
_OWN_FAILURES = (ConnectionExists, UnknownConnection, StoreRejected)


async def write_changes(
    admin: LeaseTableAdmin, changes: list[Change], concurrency: int, progress: Progress
) -> list[WriteFailure]:
    """Write every change (a `remove` only stops, and only when STARTED); the failures, one each.

    Up to TRANSACT_MAX changes go in one transaction, so 10,000 cost about 100 calls, not 10,000.
    A cancelled transaction (one of its conditions failed, or a worker wrote one of its items at
    the same moment) is written again one change at a time, where each failure is its own."""
    writes = [(change, write) for change in changes if (write := _item_update(change)) is not None]
    progress.advance(len(changes) - len(writes))
    batches = [writes[start : start + TRANSACT_MAX] for start in range(0, len(writes), TRANSACT_MAX)]

    async def one(change: Change) -> WriteFailure | None:
        try:
            await _write(admin, change)
        except _OWN_FAILURES as error:
            return WriteFailure(
                change.connection_id, f"{change.connection_id}: {change.kind} failed: {error}"
            )
        return None

    async def batch(group: list[tuple[Change, ItemUpdate]]) -> list[WriteFailure]:
        if await admin.transact([write for _, write in group]):
            progress.advance(len(group))
            return []
        failures = []
        for change, _ in group:
            failure = await one(change)
            progress.advance()
            if failure is not None:
                failures.append(failure)
        return failures

    results = await bounded(batches, batch, concurrency)
    return [failure for failures in results for failure in failures]


def _item_update(change: Change) -> ItemUpdate | None:
    """The change's one write (a `remove` of a stopped connection needs none here)."""
    entry = change.desired
    if change.kind == "remove":
        return state_update(change.connection_id, STOPPED) if change.was_started else None
    assert entry is not None
    feed = entry.feed
    if change.kind in ("start", "stop"):
        return state_update(change.connection_id, entry.state)
    build = add_update if change.kind == "add" else feed_update
    return build(
        change.connection_id,
        feed.ws_url,
        protocol=feed.protocol,
        protocol_config=feed.protocol_config,
        preset=feed.preset,
        state=entry.state,
    )


async def _write(admin: LeaseTableAdmin, change: Change) -> None:
    cid, entry = change.connection_id, change.desired
    if change.kind == "remove":
        if change.was_started:
            await admin.stop(cid)
        return
    assert entry is not None
    feed = entry.feed
    if change.kind in ("start", "stop"):
        await admin.set_desired_state(cid, entry.state)
    elif change.kind == "update":
        await admin.update_feed(
            cid,
            feed.ws_url,
            protocol=feed.protocol,
            protocol_config=feed.protocol_config,
            preset=feed.preset,
            state=entry.state,
        )
    else:
        try:
            await admin.add(
                cid,
                feed.ws_url,
                protocol=feed.protocol,
                protocol_config=feed.protocol_config,
                preset=feed.preset,
                state=entry.state,
            )
        except ConnectionExists:
            # Our own earlier attempt may have landed (an SDK retry after a lost reply), or
            # someone added it meanwhile: fine if it is what the file says, a failure otherwise.
            item = await admin.show(cid)
            if feed_differences(feed, item) or item.get("desired_state") != entry.state:
                raise ConnectionExists(
                    f"connection {cid!r} was added by someone else since the table was read: apply again"
                ) from None


async def prune_held(
    admin: LeaseTableAdmin,
    connection_ids: list[str],
    *,
    lease_seconds: float,
    wait_seconds: float,
    concurrency: int,
    progress: Progress,
) -> list[WriteFailure]:
    """Remove each stopped connection once it is released; what is still held after
    `wait_seconds` (or was started again meanwhile) is reported and left STOPPED."""
    watch = ExpiryWatch(lease_seconds)
    deadline = time.monotonic() + wait_seconds
    pending = list(connection_ids)
    failures: list[WriteFailure] = []
    while True:

        async def attempt(cid: str) -> Held | None:
            try:
                return await try_remove(admin, cid, watch)
            except UnknownConnection:
                return None  # removed meanwhile (by a concurrent remove): what we wanted

        results = await bounded(pending, attempt, concurrency)
        held: list[tuple[str, Held]] = []
        for cid, state in zip(pending, results, strict=True):
            if state is None:
                progress.advance()
            elif state.started:  # someone started it again: theirs is the newer intent
                failures.append(WriteFailure(cid, f"{cid}: not removed: it {state.reason} again"))
            else:
                held.append((cid, state))
        if not held or time.monotonic() >= deadline:
            break
        progress.describe(f"waiting for {len(held)} pruned connection(s) to be released")
        pending = [cid for cid, _ in held]
        await asyncio.sleep(WAIT_POLL_SECONDS)
    failures += [
        WriteFailure(
            cid,
            f"{cid}: not removed: it {state.reason}; it stays STOPPED: "
            "apply --prune again once it is released",
        )
        for cid, state in held
    ]
    return failures


async def bounded(items: Iterable[T], call: Callable[[T], Awaitable[R]], concurrency: int) -> list[R]:
    """`call` on every item with at most `concurrency` in flight; results in the items' order.
    The first exception stops the pool (the TaskGroup cancels the rest) and is raised as itself."""
    indexed: Iterator[tuple[int, T]] = enumerate(items)
    results: dict[int, R] = {}

    async def worker() -> None:
        for index, item in indexed:
            results[index] = await call(item)

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(worker())
    except BaseExceptionGroup as group_error:
        raise group_error.exceptions[0] from None
    return [results[index] for index in sorted(results)]
