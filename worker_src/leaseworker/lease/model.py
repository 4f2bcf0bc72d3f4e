"""Lease records and the pure decisions taken on them.

Correctness model (connection mode, docs/design.md §2a, §2d)
------------------------------------------------------
- Mutual exclusion comes from DynamoDB conditional writes, which are linearizable per item:
  of many concurrent acquirers of one expired lease, exactly one UpdateItem succeeds, and it
  increments `lease_epoch`. The epoch is the fencing token the sink records carry.
- Expiry is judged by the *acquirer's* wall clock (`lease_expires_at_ms < now - MAX_CLOCK_SKEW_MS`),
  so safety assumes every two workers' clocks differ by less than MAX_CLOCK_SKEW_MS.
- The *holder* never trusts its wall clock to decide that it still holds a lease. It keeps a
  monotonic deadline: the instant the last successful renewal was SENT, plus
  LEASE_SECONDS - MAX_CLOCK_SKEW - margin. The renewal wrote an expiry of at least
  wall(send) + LEASE_SECONDS, so while the holder's deadline has not passed no peer whose clock is
  within the skew can consider the lease expired. Pauses (SIGSTOP, GC, partitions) only make the
  holder's deadline pass sooner in real time, never later.
- Not guaranteed: safety when clocks drift apart by more than MAX_CLOCK_SKEW_MS, or when the
  monotonic clock stops while real time passes (system suspend) on a holder.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from leaseworker.lease.vocabulary import WORKER_KEY_PREFIX
from leaseworker.settings import ID_PATTERN, Settings

STARTED = "STARTED"
STOPPED = "STOPPED"
DESIRED_STATES = (STARTED, STOPPED)
NO_CHECKPOINT = -1
DEFAULT_PROTOCOL = "seqfeed/1"


class InvalidConnectionId(ValueError):
    def __init__(self, connection_id: str) -> None:
        super().__init__(
            f"invalid connection id {connection_id!r}: must match [A-Za-z0-9._:-]{{1,128}} "
            f"and not start with {WORKER_KEY_PREFIX!r}"
        )


def check_connection_id(connection_id: str) -> str:
    if not ID_PATTERN.fullmatch(connection_id) or connection_id.startswith(WORKER_KEY_PREFIX):
        raise InvalidConnectionId(connection_id)
    return connection_id


class MalformedItem(ValueError):
    """A connection item whose attributes are missing or of the wrong type."""


@dataclass(frozen=True, slots=True)
class ConnectionItem:
    """A connection item as stored (docs/design.md §2), decoded from DynamoDB's attribute values."""

    connection_id: str
    desired_state: str
    ws_url: str
    last_seq: int
    lease_owner: str | None
    lease_expires_at_ms: int
    lease_epoch: int
    failures: int = 0
    last_error: str | None = None
    updated_at_ms: int | None = None
    protocol: str = DEFAULT_PROTOCOL
    protocol_config: str | None = None  # JSON text (generic/1 and plugins)
    preset: str | None = None  # the preset the config was expanded from, for display
    cursor: str | None = None  # JSON text: the upstream position after `last_seq`

    @classmethod
    def from_attributes(cls, item: Mapping[str, Any]) -> ConnectionItem:
        cid = _string(item, "connection_id")
        if cid is None:
            raise MalformedItem("connection item without a string connection_id")
        desired = _string(item, "desired_state")
        if desired not in DESIRED_STATES:
            raise MalformedItem(f"{cid}: desired_state must be STARTED or STOPPED, got {desired!r}")
        url = _string(item, "ws_url")
        if not url:
            raise MalformedItem(f"{cid}: ws_url is missing or not a string")
        return cls(
            connection_id=cid,
            desired_state=desired,
            ws_url=url,
            last_seq=_number(item, "last_seq", cid, default=NO_CHECKPOINT),
            lease_owner=_string(item, "lease_owner"),
            lease_expires_at_ms=_number(item, "lease_expires_at_ms", cid, default=0),
            lease_epoch=_number(item, "lease_epoch", cid, default=0),
            failures=_number(item, "failures", cid, default=0),
            last_error=_string(item, "last_error"),
            updated_at_ms=_number(item, "updated_at_ms", cid, default=0) or None,
            protocol=_string(item, "protocol") or DEFAULT_PROTOCOL,
            protocol_config=_string(item, "protocol_config"),
            preset=_string(item, "preset"),
            cursor=_string(item, "cursor"),
        )

    def holder_at(self, now_ms: int, settings: Settings) -> str | None:
        """The owner, if its lease is live as seen from a clock reading `now_ms`."""
        if self.lease_owner and not is_expired(self.lease_expires_at_ms, now_ms, settings):
            return self.lease_owner
        return None


def _string(item: Mapping[str, Any], name: str) -> str | None:
    value = item.get(name)
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("S"), str):
        return None
    text: str = value["S"]
    return text


def _number(item: Mapping[str, Any], name: str, cid: str, *, default: int) -> int:
    value = item.get(name)
    if value is None:
        return default
    raw = value.get("N") if isinstance(value, dict) else None
    try:
        return int(str(raw))
    except ValueError:
        raise MalformedItem(f"{cid}: {name} must be a number, got {value!r}") from None


def is_expired(expires_at_ms: int, now_ms: int, settings: Settings) -> bool:
    """The acquire rule: expired only once the expiry is older than the clock-skew allowance."""
    return expires_at_ms < now_ms - settings.max_clock_skew_ms


DEADLINE_PASSED = "local deadline passed"  # why a lease lapsed: no renewal reached us in time
# The upstream refused our epoch (seqfeed `stale_epoch`). It may be right (someone else holds a
# newer one) or remember an epoch from another table (a recreated table, a PITR restore); either
# way the item may still name us, so the lease is handed back, conditional on owner and epoch.
UPSTREAM_STALE_EPOCH = "upstream says stale epoch"
# Why a lease may be lost to us while its item still names us: in session mode the item never
# expires, so it is handed back (worker/settle.py), never left named by our live session.
HAND_BACK_REASONS = frozenset({DEADLINE_PASSED, UPSTREAM_STALE_EPOCH})


class LeaseState(enum.Enum):
    ACQUIRING = "acquiring"  # the conditional write is in flight; nothing may be delivered yet
    HELD = "held"  # renewed recently enough: deliveries allowed until `valid_until`
    RELEASING = "releasing"  # closing (1001): what was received may still be delivered, then release
    LOST = "lost"  # another epoch owns it, or the local deadline passed: deliver nothing


@dataclass(slots=True)
class Lease:
    """A lease this worker holds, with its local monotonic deadline (docs/design.md §2d)."""

    connection_id: str
    epoch: int
    owner: str
    ws_url: str
    start_seq: int  # the checkpoint at acquisition: delivery resumes after it
    valid_until: float  # monotonic seconds
    state: LeaseState = LeaseState.HELD
    end_reason: str | None = None  # why it is being released or was lost
    protocol: str = DEFAULT_PROTOCOL
    protocol_config: str | None = None
    start_cursor: str | None = None  # JSON text: the checkpoint cursor beside `start_seq`
    # The send times of renewals not yet answered: a connection-mode renewal (worker/keeper.py)
    # or the session heartbeat (session_leases.heartbeat_in_flight). See `renewal_in_flight`.
    renewals_in_flight: list[float] = field(default_factory=list)

    def resume_from(self, item: ConnectionItem, seq: int, cursor: str | None) -> None:
        """Take what the session needs from the item as it was before our acquisition: where the
        upstream is and how it is spoken, and the checkpoint (`seq`, `cursor`) to resume after."""
        self.ws_url = item.ws_url
        self.protocol = item.protocol
        self.protocol_config = item.protocol_config
        self.start_seq = seq
        self.start_cursor = cursor

    def is_valid(self, now: float) -> bool:
        return self.state in (LeaseState.HELD, LeaseState.RELEASING) and now < self.valid_until

    def awaiting_renewal(self, now: float) -> bool:
        """Past the local deadline, but a renewal sent before it is still in flight.

        Nothing may be delivered (`is_valid` is false), yet the lease is not lost: that renewal
        was conditional on our owner and epoch, so if it lands it proves nobody took the item,
        and it extends the lease from its own send time, as every renewal does. Only renewals
        sent before the deadline count, and each answers within `renewal_timeout`, so the wait
        ends at most one local validity after the deadline. Losing the lease at the deadline
        instead moved every lease of a slow but timely DynamoDB whose round trip came within a
        tenth of a second of V − H (issue 20, 3b, seen again under CI's load)."""
        if self.state not in (LeaseState.HELD, LeaseState.RELEASING) or now < self.valid_until:
            return False
        return any(sent_at < self.valid_until for sent_at in self.renewals_in_flight)

    @contextlib.contextmanager
    def renewal_in_flight(self, sent_at: float) -> Iterator[None]:
        """While a renewal sent at monotonic `sent_at` is on the wire: past the deadline, the
        lease waits for its answer (`awaiting_renewal`) instead of being lost."""
        self.renewals_in_flight.append(sent_at)
        try:
            yield
        finally:
            self.renewals_in_flight.remove(sent_at)  # once its answer moved the deadline, or not

    def renewed(self, sent_at: float, settings: Settings) -> None:
        """A renewal sent at monotonic `sent_at` succeeded: extend the local deadline.

        A RELEASING lease is extended too: it is still ours until the release lands (its last
        batch may still be in flight to the sink), and the release carries the final checkpoint.
        """
        self.extend_to(local_deadline(sent_at, settings))

    def extend_to(self, deadline: float) -> None:
        """Move the local deadline forward (never back) to `deadline`, unless the lease is lost."""
        if self.state in (LeaseState.HELD, LeaseState.RELEASING):
            self.valid_until = max(self.valid_until, deadline)

    def lose(self, reason: str) -> None:
        if self.state is not LeaseState.LOST:
            self.state = LeaseState.LOST
            self.end_reason = reason


def local_deadline(sent_at: float, settings: Settings) -> float:
    return sent_at + settings.local_validity_seconds


def renewal_timeout(settings: Settings) -> float:
    """How long a renewal sent now may take: until the deadline its own success would set
    (`local_deadline(sent_at)`), and no longer, for past that point it could extend nothing.

    It is NOT cut at the lease's current deadline: renewals are pipelined (worker/keeper.py),
    so an older one in flight may still land and move that deadline before it passes, and this
    one then lands within the lease it extends. Cutting every attempt at the current deadline
    cancelled each renewal of a slow but timely DynamoDB (a 1.4 s round trip against 1.1 s left)
    and moved every lease (issue 20, 3b). If the lease lapses meanwhile it is LOST, and a late
    success extends nothing (`Lease.extend_to`)."""
    return settings.local_validity_seconds
