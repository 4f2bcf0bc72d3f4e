"""When may an operator remove a connection? A pure decision on the item (docs/design.md §6).

`connections remove` turns a connection into a tombstone (below) only when it is
STOPPED and *released*, that is when no worker may still be delivering it. Released means one of:

- `FREE`: no `lease_owner`. A graceful release and a failure mark both remove the owner, and a
  worker releases only after the work the lease guards has stopped (§3), so nothing is in flight.
- `EXPIRED`: a connection-mode lease that no renewal has touched for LEASE_SECONDS, judged on
  *our own monotonic clock*: its (owner, epoch, expiry) stayed the same from our first sight of
  it for LEASE_SECONDS. The last renewal that landed was sent before our first sight, so the
  holder's local deadline (§2d: send + LEASE_SECONDS - skew - margin) has passed, and it
  delivers nothing more. No wall clock is compared: an operator's clock ahead of the workers'
  used to tombstone a live lease (review 2026-12-05, J). A STOPPED lease cannot be renewed (the
  renewal requires STARTED), so it never changes again; the tombstone is conditioned on the
  exact expiry seen. So a plain `remove` (one look) never judges a lease expired; `--force`
  watches it for LEASE_SECONDS.
- `FENCED_SESSION`: a session-held lease (expiry 2**53 - 1) whose owner's session item carries
  `fenced_by`, or no longer exists (a claim that landed after its session was reaped). A fence
  makes the session's connections claimable (§2.0, §2e), for the same reason: the fenced worker
  has stopped or self-fences on its session deadline. A fence is never lifted, and a session item
  is never recreated by its worker, so checking it in the same transaction as the tombstone write
  leaves no window.

A lease still held (a live connection-mode lease, or a session-held one whose session is not
fenced) is not released: `--force` stops the connection and waits for one of the three.

The epoch across `remove` and `add`: tombstones
-----------------------------------------------
`lease_epoch` is the fencing token that sinks, consumers and upstreams remember per connection
id (§2), so it never goes backwards for an id, not even across `remove` and a later `add`.
`remove` therefore never deletes a connection item: it turns it into a *tombstone*, the same
item STOPPED, with `removed_at_ms`, its `lease_epoch` kept, and no `lease_owner` and no
`lease_expires_at_ms`. `add` of that id resurrects it and keeps the epoch. Why this is sound:

- Only the workers' acquisitions and claims change `lease_epoch`, and only by `ADD 1`, each a
  conditional write on one item, which DynamoDB applies linearizably. Nothing here removes the
  item or the attribute: `remove` rewrites the item in place and `add` sets
  `lease_epoch = if_not_exists(lease_epoch, 0)`. So every acquisition of a new incarnation
  reads, and exceeds, the highest epoch any earlier incarnation reached.
- The tombstone is written only once no worker can still deliver the old incarnation (it is
  STOPPED and released, above), conditioned on that in the same write. So the old
  incarnation's records all come before the new one's, and every new epoch is higher (S1).
- Workers never acquire a tombstone or find it: it is STOPPED (acquisition requires STARTED);
  without `lease_expires_at_ms` it is absent from `by-state-expiry`, so the orphan query and the
  fleet counts never see it; without `lease_owner` it is absent from `by-owner`, so no takeover
  finds it, and no owner-conditioned write (renew, release, checkpoint, claim) can match it.
  A worker that reads it (after a hint) sees a stopped, released connection. `start`, `stop`
  and `show` treat it as absent; `list` hides it.
- An epoch floor seeded from the clock was rejected: it trusts the operator's wall clock to
  exceed every earlier incarnation's epoch, across hosts and clock steps.

Cost: one small item per removed id, kept for good (no `purge_at`: a TTL deletion would forget
the epoch). A stale checkpoint entry of the old incarnation can never match a new epoch either.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from leaseworker.clock import monotonic, wall_ns
from leaseworker.lease.model import STARTED, STOPPED
from leaseworker.lease.vocabulary import SESSION_HELD

# Condition expressions, named once (STYLE.md §11). A tombstone carries `removed_at_ms`.
COND_LIVE = "attribute_exists(connection_id) AND attribute_not_exists(removed_at_ms)"
COND_REMOVABLE_FREE = f"{COND_LIVE} AND desired_state = :stopped AND attribute_not_exists(lease_owner)"
COND_REMOVABLE_HELD_BY = (
    f"{COND_LIVE} AND desired_state = :stopped AND lease_owner = :owner AND lease_epoch = :epoch"
)
COND_REMOVABLE_EXPIRED = f"{COND_REMOVABLE_HELD_BY} AND lease_expires_at_ms = :expires"  # unrenewed
# Checked on the owner's session item: fenced, or absent. An absent session serves nothing: its
# heartbeat never recreates the item (it stops on VANISHED), and the item is gone only after a
# reap or a TTL, so a claim that landed after the reap is not served (review 2026-12-05, D).
COND_SESSION_FENCED = "attribute_not_exists(connection_id) OR attribute_exists(fenced_by)"

# The tombstone: lease_epoch stays; without an owner or an expiry it leaves both GSIs.
UPDATE_TOMBSTONE = (
    "SET removed_at_ms = :now, updated_at_ms = :now "
    "REMOVE lease_owner, lease_expires_at_ms, last_error, failures"
)
# ... keeping a held connection's effective checkpoint: once the owner is gone its checkpoint
# item is no longer read for this connection, so the holder's newer entry goes into `last_seq`.
UPDATE_TOMBSTONE_WITH_SEQ = UPDATE_TOMBSTONE.replace(" REMOVE ", ", last_seq = :checkpoint REMOVE ")
UPDATE_TOMBSTONE_WITH_SEQ_AND_CURSOR = UPDATE_TOMBSTONE_WITH_SEQ.replace(
    " REMOVE ", ", #cursor = :cursor REMOVE "
)

WAIT_POLL_SECONDS = 0.25
PROGRESS_EVERY_SECONDS = 5.0


class Removable(enum.Enum):
    FREE = "free"
    EXPIRED = "expired"
    FENCED_SESSION = "fenced session"  # removable once the owner's session item is fenced or gone


@dataclass(frozen=True, slots=True)
class Held:
    """Not removable yet: `reason` says by whom or why, in a phrase for one error line."""

    reason: str
    started: bool  # still STARTED: it must be stopped first


@dataclass(slots=True)
class ExpiryWatch:
    """Connection-mode leases as first seen, on our monotonic clock (see EXPIRED above)."""

    lease_seconds: float
    seen: dict[tuple[str, int, int], float] = field(default_factory=dict)

    def unrenewed_for(self, owner: str, epoch: int, expires: int, now: float) -> float:
        """Seconds since we first saw this exact lease (0 at first sight)."""
        return now - self.seen.setdefault((owner, epoch, expires), now)


def removal_state(item: dict[str, Any], watch: ExpiryWatch, now: float) -> Removable | Held:
    """Whether the plain item (as `table_view.plain` gives it) may become a tombstone now.

    A session-held lease returns FENCED_SESSION: removable only if the owner's session item is
    fenced or absent, which the caller checks (and conditions the write on) itself. `now` is monotonic.
    """
    owner = item.get("lease_owner")
    epoch = item.get("lease_epoch", 0)
    if item.get("desired_state") == STARTED:
        return Held(f"is STARTED{f' and held by {owner} (epoch {epoch})' if owner else ''}", started=True)
    if item.get("desired_state") != STOPPED:
        return Held(f"has desired_state {item.get('desired_state')!r}", started=True)
    if not owner:
        return Removable.FREE
    expires = int(item.get("lease_expires_at_ms", 0) or 0)
    if expires >= SESSION_HELD:
        return Removable.FENCED_SESSION
    unrenewed = watch.unrenewed_for(str(owner), int(epoch), expires, now)
    if unrenewed >= watch.lease_seconds:
        return Removable.EXPIRED
    return Held(
        f"is STOPPED but still held by {owner} (epoch {epoch}; not renewed for {unrenewed:.1f} s "
        f"of the {watch.lease_seconds:g} s that prove it expired, on this host's own clock)",
        started=False,
    )


def session_holder_reason(item: dict[str, Any]) -> str:
    owner, epoch = item.get("lease_owner"), item.get("lease_epoch", 0)
    return f"is STOPPED but still held by the live session of {owner} (epoch {epoch})"


class NotRemovable(ValueError):
    """The connection is not STOPPED and released; str() is the one-line explanation."""

    def __init__(self, connection_id: str, held: Held) -> None:
        hint = (
            f"stop it first (`leaseworker connections stop {connection_id}`)"
            if held.started
            else "wait for its release"
        )
        super().__init__(
            f"connection {connection_id!r} {held.reason}: {hint}, or pass --force to stop it, "
            "wait for the release and remove it"
        )
        self.held = held


class ReleaseTimeout(Exception):
    """`remove --force` gave up waiting for the owner to release the connection."""

    def __init__(self, connection_id: str, held: Held, waited: float) -> None:
        super().__init__(
            f"connection {connection_id!r} {held.reason} after waiting {waited:.0f} s; it stays "
            f"STOPPED: run `leaseworker connections remove {connection_id} --force` again once it "
            "is released"
        )
        self.held = held


@dataclass(frozen=True, slots=True)
class Tombstone:
    """One conditional tombstone write; `fenced_session` also requires that session's fence."""

    condition: str
    values: dict[str, Any]
    fenced_session: str | None = None
    update: str = UPDATE_TOMBSTONE


def tombstone_for(item: dict[str, Any], state: Removable, now_ms: int) -> Tombstone:
    """The write that turns `item` (as `show` gives it: with its effective `checkpoint`) into a
    tombstone only while it is still in `state`. A held one keeps its holder's batched
    checkpoint (§2b): a fenced session's entry was newer than the item's `last_seq`, and the
    tombstone without an owner showed the checkpoint moved back (found by the simulation:
    36 -> 15, seed 119 mixed, a remove racing the peers' own free of the stopped connection)."""
    values: dict[str, Any] = {":stopped": {"S": STOPPED}, ":now": {"N": str(now_ms)}}
    if state is Removable.FREE:
        return Tombstone(COND_REMOVABLE_FREE, values)
    values[":owner"] = {"S": str(item["lease_owner"])}
    values[":epoch"] = {"N": str(item.get("lease_epoch", 0))}
    update = UPDATE_TOMBSTONE
    checkpoint, last_seq = item.get("checkpoint"), item.get("last_seq")
    if isinstance(checkpoint, int) and isinstance(last_seq, int) and checkpoint > last_seq:
        values[":checkpoint"] = {"N": str(checkpoint)}
        update = UPDATE_TOMBSTONE_WITH_SEQ
        cursor = item.get("checkpoint_cursor")
        if isinstance(cursor, str):  # the entry's cursor goes with its seq
            values[":cursor"] = {"S": cursor}
            update = UPDATE_TOMBSTONE_WITH_SEQ_AND_CURSOR
    if state is Removable.EXPIRED:
        values[":expires"] = {"N": str(item.get("lease_expires_at_ms", 0))}
        return Tombstone(COND_REMOVABLE_EXPIRED, values, update=update)
    return Tombstone(COND_REMOVABLE_HELD_BY, values, fenced_session=str(item["lease_owner"]), update=update)


class RemovableTable(Protocol):
    """What removal needs from the table (LeaseTableAdmin)."""

    async def show(self, connection_id: str) -> dict[str, Any]: ...

    async def stop(self, connection_id: str) -> None: ...

    async def write_tombstone(self, connection_id: str, tombstone: Tombstone) -> bool:
        """False when the write's condition (or the session's fence check) failed."""
        ...


def _now_ms() -> int:
    return wall_ns() // 1_000_000


async def try_remove(table: RemovableTable, connection_id: str, watch: ExpiryWatch) -> Held | None:
    """One attempt: None once the tombstone is written, else why it is not removable yet."""
    item = await table.show(connection_id)
    state = removal_state(item, watch, monotonic())
    if isinstance(state, Held):
        return state
    if await table.write_tombstone(connection_id, tombstone_for(item, state, _now_ms())):
        return None
    # Lost to a concurrent change (a start, a claim) or the session is not fenced: say what
    # holds it now; the caller decides whether to wait.
    fresh = removal_state(await table.show(connection_id), watch, monotonic())
    return fresh if isinstance(fresh, Held) else Held(session_holder_reason(item), started=False)


async def remove_forced(
    table: RemovableTable,
    connection_id: str,
    *,
    lease_seconds: float,
    hint: Callable[[], Awaitable[None]],
    wait_seconds: float,
    progress: Callable[[str], None] | None = None,
) -> None:
    """Stop the connection, tell its owner (`hint`), wait for the release, then remove it.

    Raises ReleaseTimeout after `wait_seconds` if it is still held (it then stays STOPPED), and
    NotRemovable if someone starts it again meanwhile (theirs is the newer intent).
    """
    started = monotonic()
    watch = ExpiryWatch(lease_seconds)
    if await try_remove(table, connection_id, watch) is None:
        return
    await table.stop(connection_id)
    await hint()
    last_said = -PROGRESS_EVERY_SECONDS
    while True:
        state = await try_remove(table, connection_id, watch)
        if state is None:
            return
        waited = monotonic() - started
        if state.started:
            raise NotRemovable(connection_id, state)
        if waited >= wait_seconds:
            raise ReleaseTimeout(connection_id, state, waited)
        if progress is not None and waited - last_said >= PROGRESS_EVERY_SECONDS:
            progress(f"waiting for the release: {connection_id} {state.reason} ({waited:.0f} s)")
            last_said = waited
        await asyncio.sleep(WAIT_POLL_SECONDS)
