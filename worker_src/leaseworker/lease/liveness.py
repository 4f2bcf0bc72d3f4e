"""Death detection on the observer's own monotonic clock, and the holder's session deadline.

Pure: no I/O, no clock reads. The caller passes `now` (monotonic()) so tests drive a fake
clock. The argument for why this is safe under any wall-clock offset is in session_store.py.

Observer rule (docs/design.md §2.0): a peer is dead when its `hb` has not changed for LEASE_SECONDS,
measured on the observer's clock from the first time the observer saw that value. Any change,
up or down (a restarted peer that reuses its id starts again from 1), restarts the wait; a
peer is never dead on first sight.

Holder rule (§2d, session mode): deliveries are allowed until
`sent_at(last successful heartbeat) + LEASE_SECONDS - margin`, with no clock-skew term.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from leaseworker.lease.balance import PeerLoad
from leaseworker.settings import Settings

SUSPECTED = "suspected"  # fenced by an observer that saw the counter stop
CONFIRMED = "confirmed"  # fenced by the supervisor that reaped the process (docs/design.md §2e)
# A fenced stub written by a peer for an owner whose session item no longer exists, while a
# connection is still held by it (worker/absent_owners.py): claimable like SUSPECTED, once
# LEASE_SECONDS have passed on the observer's own clock since it first saw the stub.
ABSENT = "absent"
# Heartbeats a peer's counter may stand still before its load stops counting in our share.
SILENT_AFTER_HEARTBEATS = 2.5


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One session item (`worker#<id>`) as listed."""

    worker_id: str
    hb: int
    load: int
    capacity: int
    lease_mode: str
    task_arn: str | None = None
    updated_at_ms: int = 0  # the writer's wall clock: for display only, never for death
    withdrawn: bool = False  # announced a graceful exit: no longer counted as a live peer
    fenced_by: str | None = None
    fence_kind: str | None = None
    fence_reason: str | None = None
    fenced_at_ms: int | None = None

    @property
    def fenced(self) -> bool:
        return self.fenced_by is not None


class PeerState(enum.Enum):
    LIVE = "live"  # counter moving, or not yet still for LEASE_SECONDS: counts for share and ranking
    WITHDRAWN = "withdrawn"  # leaving gracefully: not counted, still watched until it falls silent
    DEAD = "dead"  # counter still for LEASE_SECONDS on our clock: fence it with `hb = verdict.hb`
    FENCED = "fenced"  # already fenced; `fence_kind` says suspected or confirmed
    GONE = "gone"  # seen before, no longer listed (reported once, then forgotten)


@dataclass(frozen=True, slots=True)
class Verdict:
    worker_id: str
    state: PeerState
    hb: int | None  # the counter value last seen (the `:seen` of a fence)
    still_for: float  # seconds on our clock since we first saw this counter value
    session: SessionInfo | None  # None only for GONE

    @property
    def fence_kind(self) -> str | None:
        return self.session.fence_kind if self.session else None


@dataclass(slots=True)
class _Sighting:
    hb: int
    first_seen: float


class Observer:
    """Keeps, per peer, the last counter value and when this observer first saw it."""

    def __init__(self, me: str, lease_seconds: float) -> None:
        self._me = me
        self._lease_seconds = lease_seconds
        self._seen: dict[str, _Sighting] = {}

    def observe(self, sessions: Iterable[SessionInfo], now: float) -> list[Verdict]:
        """Judge a listing. `now` must be read AFTER the listing returned: a value seen in it
        was written before that instant, which is what makes the wait start late, never early
        (a `now` taken before sending the read could precede the heartbeat it returns)."""
        verdicts: list[Verdict] = []
        listed: set[str] = set()
        for session in sessions:
            listed.add(session.worker_id)
            verdicts.append(self._judge(session, now))
        for worker_id in sorted(set(self._seen) - listed):
            last = self._seen.pop(worker_id)
            verdicts.append(Verdict(worker_id, PeerState.GONE, last.hb, now - last.first_seen, None))
        return verdicts

    def _judge(self, session: SessionInfo, now: float) -> Verdict:
        sighting = self._seen.get(session.worker_id)
        if sighting is None or sighting.hb != session.hb:
            sighting = self._seen[session.worker_id] = _Sighting(session.hb, now)
        still_for = now - sighting.first_seen
        if session.fenced:
            state = PeerState.FENCED
        elif session.worker_id == self._me:
            state = PeerState.WITHDRAWN if session.withdrawn else PeerState.LIVE  # never judge ourselves
        elif still_for >= self._lease_seconds:
            state = PeerState.DEAD
        elif session.withdrawn:
            state = PeerState.WITHDRAWN
        else:
            state = PeerState.LIVE
        return Verdict(session.worker_id, state, session.hb, still_for, session)


def live_worker_ids(verdicts: Iterable[Verdict]) -> list[str]:
    """The peers that count: for fair share and for rendezvous ranking."""
    return sorted(v.worker_id for v in verdicts if v.state is PeerState.LIVE)


@dataclass(frozen=True, slots=True)
class Listing:
    """What one listing tells a worker about its fleet."""

    fenced: dict[str, SessionInfo]  # peers seen fenced, until their session is reaped
    peers: tuple[PeerLoad, ...]  # the other live workers' published load (fair share)
    live: list[str]  # the live workers, us included once listed (rendezvous ranking)
    silent_load: int = 0  # the published load of the live peers left out of `peers` as silent


def silent_after(settings: Settings) -> float:
    """How long a peer's counter may stand still before its published load stops counting in
    our fair share: SILENT_AFTER_HEARTBEATS heartbeats. A beating peer's value is seen standing
    for up to about one heartbeat (its period, then our listing's)."""
    return SILENT_AFTER_HEARTBEATS * settings.heartbeat_seconds


def read_listing(
    verdicts: list[Verdict],
    *,
    me: str,
    fenced_before: dict[str, SessionInfo],
    silent_after: float = float("inf"),
) -> Listing:
    """A fence is never undone while its session item exists (a hint may have shown us one
    this listing, read earlier, does not show yet); a reaped id may start afresh.

    A live peer whose counter has stood still for `silent_after` seconds or more (not yet for a
    lease: not fenced) is left out of `peers`, the fair share's view. It may well be cut off from
    DynamoDB: in connection mode its leases then expire and are counted free, while its last
    published load still counts them as its own. Counted twice, they capped the survivors'
    shares, and the rest waited for a second reconcile's over-share or for the peer itself (seen:
    6.58 s against L1's 5.90 s in the fault suite's ddb_stall). Only the share changes: it stays
    in `live` for rendezvous ranking, and is fenced only by the observer rule. Its load is kept
    apart as `silent_load`: the connections still need owners (lease/rebalance.py)."""
    listed = {v.worker_id for v in verdicts}
    fenced = {w: s for w, s in fenced_before.items() if w in listed} | {
        v.worker_id: v.session for v in verdicts if v.state is PeerState.FENCED and v.session is not None
    }
    others = [
        (v, v.session)
        for v in verdicts
        if v.state is PeerState.LIVE and v.worker_id not in (me, *fenced) and v.session is not None
    ]
    peers = tuple(
        PeerLoad(v.worker_id, session.load, session.capacity)
        for v, session in others
        if v.still_for < silent_after
    )
    silent_load = sum(session.load for v, session in others if v.still_for >= silent_after)
    live = [worker for worker in live_worker_ids(verdicts) if worker not in fenced]
    return Listing(fenced, peers, live, silent_load)


def claimable_kind(verdict: Verdict) -> str | None:
    """What a fenced peer's fence makes claimable: SUSPECTED (session-held connections only),
    CONFIRMED (everything it held), or None when it is not fenced."""
    if verdict.state is not PeerState.FENCED:
        return None
    return CONFIRMED if verdict.fence_kind == CONFIRMED else SUSPECTED


def session_deadline(sent_at: float, settings: Settings) -> float:
    """Until when a session holder may deliver, after a heartbeat SENT at monotonic `sent_at`
    succeeded: LEASE_SECONDS minus the fence margin, and no skew term (no wall clock is used)."""
    return sent_at + settings.lease_seconds - settings.fence_margin_seconds


@dataclass(slots=True)
class SessionValidity:
    """The holder's side: the local deadline of its own session, moved only forward."""

    settings: Settings
    valid_until: float = float("-inf")
    fenced: bool = False

    def heartbeat_succeeded(self, sent_at: float) -> None:
        if not self.fenced:
            self.valid_until = max(self.valid_until, session_deadline(sent_at, self.settings))

    def fence(self) -> None:
        """The heartbeat was refused (fenced or vanished): invalid at once and for good."""
        self.fenced = True
        self.valid_until = float("-inf")

    def is_valid(self, now: float) -> bool:
        return not self.fenced and now < self.valid_until
