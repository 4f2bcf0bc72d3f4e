"""One session task per owned connection: connect, run the protocol's open steps, deliver.

The session never decides ownership; it obeys it. Before every sink write it checks the lease's
local monotonic deadline (docs/design.md §2d), and a timer aborts the socket the instant that deadline
passes, so a worker that wakes from a pause past its deadline delivers nothing. In connection mode
a renewal sent before the deadline and still in flight defers the abort (`Lease.awaiting_renewal`):
the session keeps its socket and delivers nothing until that renewal has answered. Checkpoints are
written by the worker's checkpoint loop from `delivered_seq` and `delivered_cursor`, which only
move after the sink has acknowledged (by the accepted prefix when the sink took only part of a
batch).

The session never learns which feed it talks to: the connection's protocol (protocol/registry.py)
gives a Sans-I/O adapter per socket, and the session performs the adapter's actions
(worker/socket_run.py). It numbers the records: its counter continues the checkpoint's
`last_seq`, and a record's `seq` is that counter minus the protocol's `seq_base` (seqfeed/1: the
upstream's own seq; generic/1: 0, 1, 2, … in each epoch).

Nothing an upstream does ends a session (L3, docs/design.md §2c): a close at any point, a frame that
breaks the protocol, a refusal or a failed connect is a reconnect with backoff, and the reason goes
to `last_error`. The backoff starts again only after a connection stayed up HEALTHY_SECONDS.
Repeated failures at the same position (protocol errors, error frames, auth refusals, crashes:
MAX_FAILURES_AT_POSITION of them with nothing delivered in between) end the session as FAILED, so
a poison frame or a revoked key stops the connection with a reason instead of bouncing it. A
connection-limit refusal (`limit`) never counts: a paused old owner's socket may linger upstream.
"""

from __future__ import annotations

import asyncio
from typing import Any

from leaseworker.clock import monotonic, wall_ns
from leaseworker.lease.model import DEADLINE_PASSED, NO_CHECKPOINT, Lease, LeaseState
from leaseworker.lease.ownership import Progress
from leaseworker.no_linger import send_deadline
from leaseworker.observability.logging import get_logger, log_context
from leaseworker.observability.metrics import MetricName
from leaseworker.protocol.adapter import ConfigError, OpenReason, UpstreamProtocol
from leaseworker.protocol.registry import ProtocolSpec, build, parse_config_text
from leaseworker.records import SinkRecord
from leaseworker.sinks.base import SinkError, writes_at_once
from leaseworker.worker.backoff import FatalUpstreamError, ReconnectPacing
from leaseworker.worker.batch import Batch
from leaseworker.worker.checkpoint_cursor import checkpoint_text
from leaseworker.worker.endings import Outcome, SessionResult, SinkFailed, Stop
from leaseworker.worker.failures import FailureRecorder, RecordFailure
from leaseworker.worker.fence import RECHECK_SECONDS, LeaseFence
from leaseworker.worker.session_deps import SessionDeps

logger = get_logger(__name__)

MAX_FAILURES_AT_POSITION = 5  # failures with no delivery in between before the connection is failed
MAX_CONSECUTIVE_CRASHES = MAX_FAILURES_AT_POSITION  # crashes count among them


class ConnectionSession:
    def __init__(self, lease: Lease, deps: SessionDeps, record_failure: RecordFailure) -> None:
        self.lease = lease
        self.delivered_seq = lease.start_seq
        self.delivered_cursor = lease.start_cursor  # JSON text, beside delivered_seq
        self.delivered_at_ms: int | None = None  # when the last delivered record was received
        self.checkpointed_seq = lease.start_seq
        self.replays_dropped = 0  # overlapping replays dropped (§4.1 rule 5), duplicates by id
        self.failures_here = 0  # failures at the current position, reset by any delivery
        self.open_reason: OpenReason = "connect" if lease.start_seq == NO_CHECKPOINT else "takeover"
        self.deps = deps
        self.settings = deps.settings
        self.failures = FailureRecorder(record_failure)
        self.batch = Batch()
        self.batch_cursors: list[str | None] = []  # the checkpoint cursor after each batched record
        self.stop_requested = asyncio.Event()
        self.protocol: UpstreamProtocol | None = None  # built from the lease when the task starts
        self._fence = LeaseFence(lease, self._on_deadline)
        self._writes_at_once = writes_at_once(deps.sink)
        self._abort_socket: list[Any] = []  # the open sockets' transports, aborted on the deadline
        self.current_ws: Any = None  # the socket records come from now (SocketRun sets it)

    # ------------------------------------------------------------------ control, from the worker

    def request_release(self, reason: str) -> None:
        """Graceful: close the socket with 1001, deliver what was received, then release."""
        if self.lease.state is LeaseState.HELD:
            self.lease.state = LeaseState.RELEASING
            self.lease.end_reason = reason
        self.stop_requested.set()

    @property
    def progress(self) -> Progress:
        """An immutable snapshot for the checkpoint loop: what the sink accepted, what is recorded."""
        return Progress(self.lease, self.delivered_seq, self.checkpointed_seq, self.delivered_cursor)

    def checkpoint_recorded(self, seq: int) -> None:
        """The checkpoint loop made `seq` durable for this lease."""
        self.checkpointed_seq = max(self.checkpointed_seq, seq)

    def lose(self, reason: str) -> None:
        """The lease is gone: abort the socket at once, no close handshake, deliver nothing."""
        self.lease.lose(reason)
        self.abort()
        self.stop_requested.set()

    # ------------------------------------------------------------------ the task

    async def run(self) -> SessionResult:
        from leaseworker.worker.socket_run import SocketRun  # the per-socket half

        with log_context(connection_id=self.lease.connection_id, epoch=self.lease.epoch):
            self._fence.arm()
            try:
                self.protocol = self._build_protocol()
                return await self._deliver_forever(SocketRun)
            except FatalUpstreamError as error:
                logger.error("connection can never work", extra={"reason": str(error)})
                return SessionResult(Outcome.FAILED, str(error))
            except ConfigError as error:
                logger.error("invalid protocol config", extra={"reason": str(error)})
                return SessionResult(Outcome.FAILED, f"invalid protocol config: {error}")
            finally:
                self._fence.cancel()

    def _build_protocol(self) -> UpstreamProtocol:
        lease = self.lease
        spec = ProtocolSpec(lease.protocol, lease.ws_url, parse_config_text(lease.protocol_config))
        return build(spec)

    async def _deliver_forever(self, socket_run: Any) -> SessionResult:
        pacing = ReconnectPacing()
        failed_at = self.delivered_seq
        while True:
            if self.stopping():
                return self.ending()
            crashed: str | None = None
            try:
                reason, counts = await socket_run(self).attempt(pacing)
            except Stop as stop:
                return stop.result
            except (FatalUpstreamError, ConfigError):
                raise
            except Exception as error:  # a bug or an input nobody foresaw: contained, counted
                logger.exception("session crashed; keeping the lease and backing off")
                reason, counts = f"session crashed: {type(error).__name__}: {error}", True
                crashed = f"{type(error).__name__}: {error}"
            if counts:
                if self.delivered_seq > failed_at:
                    self.failures_here = 0  # it delivered since the last failure: not "in a row"
                failed_at = self.delivered_seq
                self.failures_here += 1
                if self.failures_here >= MAX_FAILURES_AT_POSITION:
                    n = self.failures_here
                    why = (
                        f"session crashed {n} times: {crashed}"
                        if crashed
                        else f"{n} failures at seq {failed_at}"
                    )
                    return SessionResult(Outcome.FAILED, why if crashed else f"{why}: {reason}")
            if self.stopping():
                return self.ending()
            await self._retry_later(reason, pacing.next_delay())

    # ------------------------------------------------------------------ records and the sink

    def add_record(
        self, record_kind: str, data: Any, *, cursor: Any, key: str | None, checkpoint: Any, size: int
    ) -> None:
        """Number a record and put it in the batch (the caller delivers when the batch is full)."""
        protocol = self.protocol
        assert protocol is not None
        counter = self.delivered_seq + len(self.batch) + 1
        previous = self.batch_cursors[-1] if self.batch_cursors else self.delivered_cursor
        lease = self.lease
        record = SinkRecord(
            connection_id=lease.connection_id,
            seq=counter - protocol.seq_base(lease.start_seq),
            epoch=lease.epoch,
            worker_id=lease.owner,
            received_at_ms=wall_ns() // 1_000_000,
            data=data,
            cursor=cursor,
            kind=record_kind,
            key=key,
        )
        cursor_text = previous if checkpoint is None else checkpoint_text(checkpoint, protocol)  # may refuse
        self.batch.add(record, size)
        self.batch_cursors.append(cursor_text)

    async def deliver(self) -> None:
        """Hand the batch to the sink if, and only if, the lease is still valid right now."""
        batch, cursors = self.batch.records, self.batch_cursors
        if not batch:
            return
        self.clear_batch()
        now = monotonic()
        if not self.lease.is_valid(now):
            await self._wait_for_renewal()
            now = monotonic()
            if not self.lease.is_valid(now):
                raise Stop(self.ending())
        try:
            if self._writes_at_once:
                await self.deps.sink.write(batch, valid=self.valid)
            else:
                # The write may not outlive the lease: past the deadline another epoch may deliver.
                with send_deadline(self.lease.valid_until):  # checked again at each socket write
                    async with asyncio.timeout(self.lease.valid_until - now):
                        await self.deps.sink.write(batch, valid=self.valid)
        except (SinkError, TimeoutError) as error:
            accepted = min(max(error.accepted, 0), len(batch)) if isinstance(error, SinkError) else 0
            self._delivered(batch[:accepted], cursors[:accepted])
            self.deps.metrics.count(MetricName.SinkErrors)
            logger.error(
                "sink refused a batch; resubscribing",
                extra={"error": str(error) or "timeout", "accepted": accepted, "batch": len(batch)},
            )
            permanent = isinstance(error, SinkError) and error.permanent
            raise SinkFailed(str(error) or "sink write timed out", permanent=permanent) from None
        self._delivered(batch, cursors)

    def clear_batch(self) -> None:
        self.batch.clear()
        self.batch_cursors = []

    def _delivered(self, records: list[SinkRecord], cursors: list[str | None]) -> None:
        if not records:
            return
        protocol = self.protocol
        assert protocol is not None
        self.delivered_seq = records[-1].seq + protocol.seq_base(self.lease.start_seq)
        self.delivered_cursor = cursors[-1]
        self.delivered_at_ms = records[-1].received_at_ms
        self.open_reason = "reconnect"  # a hole from here on starts after a delivered record
        metrics = self.deps.metrics
        data = sum(1 for r in records if r.kind == "data")
        if data:
            metrics.count(MetricName.MessagesDelivered, data)
        for record in records:
            if record.kind == "gap":
                metrics.count(MetricName.GapsMarked)
                since, until = record.data.get("since_ms"), record.data.get("until_ms")
                if isinstance(since, int) and isinstance(until, int) and until >= since:
                    metrics.observe(MetricName.GapSeconds, (until - since) / 1000)

    # ------------------------------------------------------------------ helpers

    def valid(self) -> bool:
        return self.lease.is_valid(monotonic())

    def stopping(self) -> bool:
        if self.stop_requested.is_set():
            return True
        now = monotonic()
        return not self.lease.is_valid(now) and not self.lease.awaiting_renewal(now)

    async def _wait_for_renewal(self) -> None:
        """Past the deadline with a renewal in flight: deliver nothing until it has answered
        (bounded by `renewal_timeout`), or a stop is asked for."""
        while self.lease.awaiting_renewal(monotonic()) and not self.stop_requested.is_set():
            try:
                async with asyncio.timeout(RECHECK_SECONDS):
                    await self.stop_requested.wait()
            except TimeoutError:
                pass

    def ending(self) -> SessionResult:
        if self.lease.state is LeaseState.RELEASING and monotonic() < self.lease.valid_until:
            return SessionResult(Outcome.RELEASE, self.lease.end_reason or "released")
        if self.lease.state is not LeaseState.LOST:
            self.lease.lose(DEADLINE_PASSED)
            self.deps.metrics.count(MetricName.SelfFenced)
            logger.warning("self-fenced: lease deadline passed without a renewal")
        return SessionResult(Outcome.LOST, self.lease.end_reason or "lost")

    async def _retry_later(self, reason: str, delay: float) -> None:
        self.deps.metrics.count(MetricName.Reconnects)
        logger.warning("reconnecting", extra={"reason": reason, "delay_s": round(delay, 3)})
        await self.failures(self.lease, reason)
        try:
            async with asyncio.timeout(delay):
                await self.stop_requested.wait()
        except TimeoutError:
            pass

    def track_socket(self, transport: Any) -> None:
        self._abort_socket.append(transport)

    def untrack_socket(self, transport: Any) -> None:
        if transport in self._abort_socket:
            self._abort_socket.remove(transport)

    def abort(self) -> None:
        for transport in list(self._abort_socket):
            transport.abort()

    def _on_deadline(self) -> None:
        """The local deadline passed without a renewal: abort the socket at once (§2d)."""
        self.abort()
        self.stop_requested.set()
