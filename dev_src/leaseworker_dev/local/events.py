"""What a local fleet is doing, read from the outside: the table, the feed, the sink, the logs.

`FleetMonitor.poll()` reads, incrementally:
- the lease table (one consistent scan): who owns what, at which epoch, the checkpoints;
- the feed's session log, and each real feed replay's (leaseworker_dev.local.replays): when the
  upstream saw each subscription (the measured clock for takeover and handoff times, as in the
  system tests);
- the sink files, `<worker>.jsonl`: messages per second per worker, highest seq per connection,
  and the gap markers of generic/1 connections (docs/design.md §4.3, §5), each shown as a `gap` event;
  a replayable connection that moved to a new epoch without one is shown as `resumed`;
- the workers' JSON logs: self-fencing, which only the worker itself can see.

It turns the differences between successive readings into `Event`s. A fault recorded with
`fault()` (kill, pause, terminate) is followed until every connection the victim held has been
subscribed again at a higher epoch; each one becomes a "taken over" or "handed off" event with
the seconds from the signal to the new subscription, and a summary event closes the fault.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import deque
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from leaseworker.lease.admin import LeaseTableAdmin, Snapshot
from leaseworker.lease.budget_store import paced_term_s
from leaseworker.lease.errors import StoreError
from leaseworker_dev.local.fleet import TABLE, Fleet
from leaseworker_dev.local.services import local_dynamodb

# crash: SIGKILL of the worker child alone, an OOM-like death its supervisor sees (the fence path,
# docs/design.md §2e); kill: SIGKILL of the whole process group, a host-like death (the lease path).
FaultKind = Literal["crash", "kill", "pause", "terminate"]
RATE_WINDOW_S = 3.0
SIGNALS = {
    "crash": signal.SIGKILL,
    "kill": signal.SIGKILL,
    "pause": signal.SIGSTOP,
    "terminate": signal.SIGTERM,
}
# One table scan may hold the view's loop this long; a stop request waits for it at most once.
POLL_DEADLINE_S = 2.0
CLOSE_DEADLINE_S = 2.0


def takeover_bound_s(fleet: Fleet, connect_allowance_s: float = 1.5) -> float:
    """docs/design.md §2c L1 for this fleet's lease mode (session is the default), from
    worker/takeover_bound.py."""
    from leaseworker.worker.takeover_bound import takeover_bound_s as bound_s

    return bound_s(fleet.lease_mode or "session", fleet.timings, connect_allowance_s)


HANDOFF_BOUND_S = 1.5  # L2: "about one second"
# A child's death seen by its supervisor: fence + hints (≈0.3–1 s, the SDK is imported lazily), a
# peer's sweep and up to two rendezvous steps, then the connect (docs/design.md §2e).
FENCE_PATH_S = 1.5


def fault_bound_s(fleet: Fleet, kind: FaultKind, connect_allowance_s: float = 1.5) -> float:
    """The bound a fault's connections must move within: L2 for a graceful stop, the fence path
    for a crash the supervisor sees, and L1 (the lease path) for a host-like death or a pause."""
    if kind == "terminate":
        return HANDOFF_BOUND_S
    if kind == "crash":
        return FENCE_PATH_S + connect_allowance_s
    return takeover_bound_s(fleet, connect_allowance_s)


def fault_name(kind: FaultKind) -> str:
    """SIGKILL child | SIGKILL group | SIGSTOP | SIGTERM: what was sent, and to whom."""
    name = SIGNALS[kind].name
    return f"{name} child" if kind == "crash" else f"{name} group" if kind == "kill" else name


class Tail:
    """New whole lines of a growing file since the last call (a torn last line waits)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self._partial = b""

    def lines(self) -> list[str]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self._partial + data
        *whole, self._partial = data.split(b"\n")
        return [line.decode(errors="replace") for line in whole if line.strip()]


@dataclass(frozen=True)
class Event:
    t: float  # wall-clock seconds
    kind: str  # acquired | released | taken over | handed off | lost | self-fenced | fault | gap
    # | resumed | note
    text: str

    def stamp(self) -> str:
        return time.strftime("%H:%M:%S", time.localtime(self.t)) + f".{int(self.t * 10) % 10}"


@dataclass
class Fault:
    """A signal sent to a worker, followed until its connections are subscribed again elsewhere."""

    kind: FaultKind
    worker: str
    sent_ms: int
    epochs: dict[str, int]  # the victim's connections and their epochs when the signal was sent
    times_s: dict[str, float] = field(default_factory=dict)
    new_owner: dict[str, str] = field(default_factory=dict)
    closed: bool = False

    @property
    def measured_as(self) -> str:
        return "handed off" if self.kind == "terminate" else "taken over"

    @property
    def done(self) -> bool:
        return set(self.times_s) >= set(self.epochs)

    @property
    def max_s(self) -> float:
        return max(self.times_s.values(), default=0.0)


@dataclass
class WorkerStats:
    name: str
    owned: int = 0
    rate: float = 0.0
    heartbeat_age_s: float | None = None
    load: int | None = None  # as its session last published it
    session: str = "-"  # live | fenced (confirmed/suspected) | withdrawn | - (no session item)
    delivered: int = 0
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=64))


def session_state(session: dict[str, Any]) -> str:
    """live, withdrawn (leaving gracefully), or fenced and how (a confirmed death, a suspicion)."""
    if session.get("fenced_by"):
        return f"fenced ({session.get('fence_kind') or 'suspected'})"
    return "withdrawn" if session.get("withdrawn_at_ms") else "live"


@dataclass
class ConnectionStats:
    """What the sink holds for one connection (records of every kind, gap markers among them)."""

    records: int = 0
    gaps: int = 0
    raw: int = 0
    epoch: int | None = None  # the highest epoch seen in the sink
    cursor: Any = None  # the last record's cursor at that epoch
    epoch_max_seq: int = -1  # the highest seq at that epoch (generic/1 counts from 0 per epoch)
    last_ms: int | None = None  # received_at_ms of the last data record


def cursor_label(item: dict[str, Any]) -> str:
    """What a generic/1 connection's cursor counts, from its config's cursor.path: `trade` for
    Coinbase's /trade_id, `time_us` for Jetstream's; `cursor` when unknown."""
    try:
        path = json.loads(str(item.get("protocol_config") or "{}"))["cursor"]["path"]
    except (ValueError, KeyError, TypeError):
        return "cursor"
    name = str(path).rsplit("/", 1)[-1]
    return name.removesuffix("_id") or "cursor"


def _cursor_text(cursor: Any) -> str:
    """A cursor as the view shows it; per-key cursors (a dict) as `BTC-USD 1041, ETH-USD 980`."""
    if isinstance(cursor, dict):
        return ", ".join(f"{key} {value}" for key, value in cursor.items())
    return str(cursor)


def gap_text(cid: str, data: dict[str, Any], label: str, last_ms: int | None = None) -> str:
    """`coinbase-1 BTC-USD takeover 1.2 s (trade 1041→1047)`: a gap marker's data (docs/design.md §5).

    The duration is until_ms − since_ms; when the marker does not know since_ms (a takeover: the
    new owner never saw the last record), it is measured from the last record of the connection
    the sink holds (`last_ms`), and says so with `≈`."""
    parts = [cid]
    if data.get("key") is not None:
        parts.append(str(data["key"]))
    parts.append(str(data.get("reason", "?")))
    since, until = data.get("since_ms"), data.get("until_ms")
    if isinstance(since, int) and isinstance(until, int):
        parts.append(f"{(until - since) / 1000:.1f} s")
    elif isinstance(until, int) and last_ms is not None and until >= last_ms:
        parts.append(f"≈{(until - last_ms) / 1000:.1f} s")
    first, last = data.get("from_cursor"), data.get("to_cursor")
    if first is None and last is None:
        bounds = "bounds unknown"
    elif first is None:
        bounds = f"nothing delivered before; next {label} {_cursor_text(last)}"
    else:
        arrow = " → " if isinstance(first, dict) else "→"
        bounds = f"{label} {_cursor_text(first)}{arrow}{'…' if last is None else _cursor_text(last)}"
    return " ".join(parts) + f" ({bounds})"


class TableReader:
    """One DynamoDB client for the whole run, on a private event loop (the monitor is synchronous).

    Every scan has a deadline (POLL_DEADLINE_S); a slow or failed one raises a StoreError."""

    def __init__(self, endpoint: str) -> None:
        self._endpoint = endpoint
        self._loop = asyncio.new_event_loop()
        self._stack = AsyncExitStack()
        self._admin: LeaseTableAdmin | None = None

    async def _open(self) -> LeaseTableAdmin:
        client = await self._stack.enter_async_context(local_dynamodb(self._endpoint))
        return LeaseTableAdmin(client, TABLE, call_timeout=POLL_DEADLINE_S)

    def scan(self) -> Snapshot:
        """The connection items and the session items by worker id, from one scan."""
        if self._admin is None:
            self._admin = self._loop.run_until_complete(self._open())
        snapshot: Snapshot = self._loop.run_until_complete(self._admin.snapshot())
        return snapshot

    def close(self) -> None:
        """Close the client within CLOSE_DEADLINE_S; the process is exiting either way."""
        try:
            self._loop.run_until_complete(asyncio.wait_for(self._stack.aclose(), CLOSE_DEADLINE_S))
        except (TimeoutError, OSError):
            pass  # only sockets to DynamoDB Local are left, and it is being stopped
        finally:
            self._loop.close()


class FleetMonitor:
    """Polls a running `Fleet` and keeps what the live view and the scenario need."""

    def __init__(self, fleet: Fleet, *, max_events: int = 200) -> None:
        self.fleet = fleet
        self.reader = TableReader(fleet.endpoint)
        self.items: dict[str, dict[str, Any]] = {}
        self.sessions: dict[str, dict[str, Any]] = {}  # worker id -> its session item
        self.events: deque[Event] = deque(maxlen=max_events)
        self.faults: list[Fault] = []
        self.workers: dict[str, WorkerStats] = {}
        self.sink_max: dict[str, int] = {}
        self.conn_stats: dict[str, ConnectionStats] = {}
        self.samples: list[dict[str, int]] = []  # successive {connection_id: last_seq}, for S3
        self._feeds = [Tail(path) for path in fleet.session_logs()]
        self._sinks: dict[str, Tail] = {}
        self._logs: dict[str, Tail] = {}
        self._feed_events: list[dict[str, Any]] = []
        self.table_error: str | None = None  # why the last scan failed, while it keeps failing

    # ------------------------------------------------------------------ inputs

    def note(self, text: str, kind: str = "note") -> None:
        self.events.append(Event(time.time(), kind, text))

    def signal(self, kind: FaultKind, worker: str) -> Fault:
        """Send the fault's signal to `worker`; follow the leases it held at that moment (the
        previous reading if the table cannot be read now)."""
        scanned = self._scan()
        items = scanned[0] if scanned else list(self.items.values())
        send = self.fleet.signal_child if kind == "crash" else self.fleet.signal
        sent_s = send(worker, SIGNALS[kind])
        epochs = {
            str(item["connection_id"]): int(item.get("lease_epoch", 0))
            for item in items
            if item.get("lease_owner") == worker and int(item.get("lease_expires_at_ms", 0) or 0) > 0
        }
        record = Fault(kind, worker, int(sent_s * 1000), epochs)
        self.faults.append(record)
        self.events.append(
            Event(
                sent_s,
                "fault",
                f"{fault_name(kind)} {worker} (held {len(epochs)}: {_short(sorted(epochs))})",
            )
        )
        if not epochs:
            record.closed = True
        return record

    # ------------------------------------------------------------------ polling

    def poll(self) -> None:
        now = time.time()
        scanned = self._scan()
        if scanned is not None:
            self.sessions = scanned[1]
            items = {str(item["connection_id"]): item for item in scanned[0]}
            self._diff(self.items, items, now)
            self.items = items
            self.samples.append({cid: int(item.get("last_seq", -1)) for cid, item in items.items()})
        self._read_sinks(now)
        self._read_logs()
        self._read_feed()
        self._worker_stats(now)

    def _scan(self) -> Snapshot | None:
        """The table's items (connections, sessions), or None (noted once per outage) when the
        scan failed or was slow."""
        try:
            items = self.reader.scan()
        except StoreError as error:
            if self.table_error is None:
                self.note(f"cannot read the lease table ({error}); showing the last reading", "lost")
            self.table_error = str(error)
            return None
        if self.table_error is not None:
            self.note("the lease table is readable again")
            self.table_error = None
        return items

    def _paced_s(self, fault: Fault) -> float:
        """L1's budget term (docs/tuning.md): the victim's connections that draw on one host's
        connect budget reconnect paced by it."""
        items = [self.items.get(cid, {}) for cid in fault.epochs]
        return paced_term_s((str(i.get("ws_url", "")), i.get("protocol_config")) for i in items)

    def _diff(self, before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]], now: float) -> None:
        for cid, item in after.items():
            old = before.get(cid)
            owner = item.get("lease_owner")
            epoch = int(item.get("lease_epoch", 0))
            old_owner = old.get("lease_owner") if old else None
            old_epoch = int(old.get("lease_epoch", 0)) if old else 0
            if old is None and before:
                self.events.append(Event(now, "note", f"{cid} added"))
            if epoch > old_epoch and owner:
                if old_owner and old_owner != owner:
                    text = f"{cid} moved from {old_owner} to {owner} (epoch {epoch})"
                else:
                    text = f"{cid} acquired by {owner} (epoch {epoch})"
                if not self._followed(cid):
                    self.events.append(Event(now, "acquired", text))
            elif old_owner and not owner and old_epoch == epoch:
                self.events.append(Event(now, "released", f"{cid} released by {old_owner}"))
            if old and item.get("desired_state") != old.get("desired_state"):
                self.events.append(Event(now, "note", f"{cid} is now {item.get('desired_state')}"))
            error = item.get("last_error")
            if error and (not old or old.get("last_error") != error):
                self.events.append(Event(now, "lost", f"{cid} error: {error}"))
        for cid in set(before) - set(after):
            self.events.append(Event(now, "note", f"{cid} removed"))

    def _followed(self, cid: str) -> bool:
        """A change that an open fault will report with its measured time."""
        return any(not f.closed and cid in f.epochs for f in self.faults)

    def _read_sinks(self, now: float) -> None:
        for path in sorted(self.fleet.sink_dir.glob("*.jsonl")):
            tail = self._sinks.setdefault(path.stem, Tail(path))
            stats = self.workers.setdefault(path.stem, WorkerStats(path.stem))
            for line in tail.lines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                cid, seq = str(record["connection_id"]), int(record["seq"])
                self.sink_max[cid] = max(self.sink_max.get(cid, -1), seq)
                stats.delivered += 1
                self._record(cid, record)
            stats.samples.append((now, stats.delivered))

    def _record(self, cid: str, record: dict[str, Any]) -> None:
        """Count a sink record; a gap marker becomes a `gap` event, and a replayable connection's
        first record at a new epoch that is not one becomes a `resumed` event."""
        conn = self.conn_stats.setdefault(cid, ConnectionStats())
        conn.records += 1
        kind = record.get("kind", "data")
        epoch = int(record.get("epoch", 0))
        when = int(record.get("received_at_ms", 0) or 0) / 1000 or time.time()
        item = self.items.get(cid, {})
        if kind == "gap":
            conn.gaps += 1
            data = record.get("data")
            data = data if isinstance(data, dict) else {}
            self.events.append(Event(when, "gap", gap_text(cid, data, cursor_label(item), conn.last_ms)))
        elif kind == "raw":
            conn.raw += 1
        if kind != "gap":
            received = int(record.get("received_at_ms", 0) or 0)
            conn.last_ms = max(conn.last_ms or 0, received) or None
        if conn.epoch is None or epoch > conn.epoch:
            moved = conn.epoch is not None
            if moved and kind != "gap" and item.get("protocol", "seqfeed/1") != "seqfeed/1":
                owner = record.get("worker_id")
                self.events.append(
                    Event(
                        when,
                        "resumed",
                        f"{cid} resumed by {owner} at epoch {epoch} from {cursor_label(item)} "
                        f"{conn.cursor}, no gap marker",
                    )
                )
            conn.epoch = epoch
            conn.epoch_max_seq = -1
        if epoch == conn.epoch:
            conn.epoch_max_seq = max(conn.epoch_max_seq, int(record["seq"]))
            if record.get("cursor") is not None:
                conn.cursor = record.get("cursor")

    def _read_logs(self) -> None:
        for name in self.fleet.workers:
            tail = self._logs.setdefault(name, Tail(self.fleet.logs / f"{name}.log"))
            for line in tail.lines():
                if "self-fenced" not in line and '"lease lost"' not in line:
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                cid, epoch = record.get("connection_id"), record.get("epoch")
                if "self-fenced" in line:
                    text = (
                        f"{cid} self-fenced by {name} (epoch {epoch}): lease deadline passed, socket aborted"
                    )
                    self.events.append(Event(time.time(), "self-fenced", text))
                else:
                    reason = record.get("reason", "")
                    self.events.append(Event(time.time(), "lost", f"{cid} lost by {name}: {reason}"))

    def _read_feed(self) -> None:
        new = []
        for line in (line for tail in self._feeds for line in tail.lines()):
            try:
                new.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        self._feed_events.extend(e for e in new if e.get("event") == "subscribe")
        for record in self.faults:
            if record.closed:
                continue
            for event in self._feed_events:
                cid = str(event.get("connection_id"))
                if (
                    cid in record.epochs
                    and cid not in record.times_s
                    and int(event.get("t_ms", 0)) >= record.sent_ms
                    and int(event.get("epoch", -1)) > record.epochs[cid]
                ):
                    seconds = (int(event["t_ms"]) - record.sent_ms) / 1000
                    record.times_s[cid] = seconds
                    record.new_owner[cid] = str(event.get("worker_id"))
                    self.events.append(
                        Event(
                            int(event["t_ms"]) / 1000,
                            record.measured_as,
                            f"{cid} {record.measured_as} {record.worker} → {event.get('worker_id')} "
                            f"in {seconds:.2f} s",
                        )
                    )
            if record.done:
                record.closed = True
                bound = fault_bound_s(self.fleet, record.kind) + self._paced_s(record)
                verdict = "within" if record.max_s <= bound else "OVER"
                self.events.append(
                    Event(
                        time.time(),
                        record.measured_as,
                        f"{record.worker}: {len(record.times_s)} connections {record.measured_as}, "
                        f"max {record.max_s:.2f} s ({verdict} the {bound:.1f} s bound)",
                    )
                )
        # Subscriptions older than every open fault can never match again.
        oldest = min((f.sent_ms for f in self.faults if not f.closed), default=None)
        self._feed_events = [] if oldest is None else [e for e in self._feed_events if e["t_ms"] >= oldest]

    def _worker_stats(self, now: float) -> None:
        owned: dict[str, int] = {}
        for item in self.items.values():
            owner = item.get("lease_owner")
            if owner and int(item.get("lease_expires_at_ms", 0) or 0) > 0:
                owned[owner] = owned.get(owner, 0) + 1
        for name in self.fleet.workers:
            stats = self.workers.setdefault(name, WorkerStats(name))
            stats.owned = owned.get(name, 0)
            session = self.sessions.get(name)
            if session is not None:  # both modes heartbeat a session item (docs/design.md §2.0)
                stats.heartbeat_age_s = (now * 1000 - int(session.get("updated_at_ms", 0) or 0)) / 1000
                stats.load = int(session.get("load", 0) or 0)
                stats.session = session_state(session)
            else:  # not registered yet, or reaped
                stats.heartbeat_age_s, stats.load, stats.session = None, None, "-"
            window = [s for s in stats.samples if s[0] >= now - RATE_WINDOW_S]
            if len(window) >= 2 and window[-1][0] > window[0][0]:
                stats.rate = (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0])
            else:
                stats.rate = 0.0

    # ------------------------------------------------------------------ queries

    def lag(self, cid: str) -> int | None:
        """Records in the sink not yet covered by the checkpoint: highest sink seq − the
        effective checkpoint (`checkpoint_of`)."""
        if cid not in self.sink_max:
            return None
        item = self.items.get(cid, {})
        conn = self.conn_stats.get(cid)
        if item.get("protocol", "seqfeed/1") != "seqfeed/1" and conn is not None:
            # generic/1 seqs restart at 0 in each epoch: compare within the current one.
            # The checkpoint may still be an older epoch's (the new owner has not written one
            # yet): then the lag is unknown.
            lag = conn.epoch_max_seq - checkpoint_of(item)
            return lag if conn.epoch == int(item.get("lease_epoch", 0)) and lag >= 0 else None
        return self.sink_max[cid] - checkpoint_of(item)

    def busiest(self, candidates: list[str]) -> str | None:
        """The candidate worker owning the most connections (ties: the oldest name)."""
        if not candidates:
            return None
        return max(candidates, key=lambda n: (self.workers.get(n, WorkerStats(n)).owned, -_order(n)))

    def close(self) -> None:
        self.reader.close()


def checkpoint_of(item: dict[str, Any]) -> int:
    """The effective checkpoint (docs/design.md §2b) that `LeaseTableAdmin.snapshot` computed for
    the item: the newer of its last_seq and its owner's batched entry. In session mode last_seq
    alone moves only on a release or a claim."""
    value = item.get("checkpoint", item.get("last_seq", -1))
    return int(value) if isinstance(value, int | float) else -1


def _order(name: str) -> int:
    digits = "".join(ch for ch in name if ch.isdigit())
    return int(digits) if digits else 0


def _short(ids: list[str], limit: int = 4) -> str:
    return ", ".join(ids[:limit]) + (f" +{len(ids) - limit}" if len(ids) > limit else "")
