"""One session task per owned connection: connect, subscribe after the checkpoint, deliver.

The session never decides ownership; it obeys it. Before every sink write it checks the lease's
local monotonic deadline (DESIGN.md §2d), and a timer aborts the socket the instant that deadline
passes, so a worker that wakes from a pause past its deadline delivers nothing. Checkpoints are
written by the worker's checkpoint loop from `delivered_seq`, which only moves after the sink
has acknowledged (by the accepted prefix when the sink took only part of a batch).

Nothing an upstream does ends a session (L3, DESIGN.md §2c): a close at any point, a frame that
breaks the protocol or a failed connect is a reconnect with backoff, and the reason goes to
`last_error`. The backoff starts again only after a connection stayed up HEALTHY_SECONDS. An
unexpected exception inside one connection attempt is a crash: the session keeps its lease,
records it and backs off; MAX_CONSECUTIVE_CRASHES crashes with no delivery in between end the
session as FAILED, so the connection is stopped with a reason instead of bouncing between
workers. The worst-case memory of one connection is stated in worker/upstream.py.
"""

from __future__ import annotations

import asyncio
import enum
import math
import time
from dataclasses import dataclass
from typing import NoReturn

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from leaseworker.lease.model import DEADLINE_PASSED, UPSTREAM_STALE_EPOCH, Lease, LeaseState
from leaseworker.no_linger import send_deadline
from leaseworker.observability.logging import get_logger, log_context
from leaseworker.observability.metrics import MetricName, WorkerMetrics
from leaseworker.observability.tracing import Tracing
from leaseworker.protocol.base import DataFrame, ErrorFrame, ProtocolError, ReplayedFrame, UpstreamProtocol
from leaseworker.protocol.seqfeed import STALE_EPOCH
from leaseworker.records import SinkRecord
from leaseworker.settings import Settings
from leaseworker.sinks.base import Sink, SinkError, writes_at_once
from leaseworker.worker import upstream
from leaseworker.worker.backoff import FatalUpstreamError, ReconnectPacing, check_upstream_url, is_fatal
from leaseworker.worker.batch import BATCH_LINGER_SECONDS, Batch, frame_size
from leaseworker.worker.failures import FailureRecorder, RecordFailure
from leaseworker.worker.fence import LeaseFence

logger = get_logger(__name__)

MAX_CONSECUTIVE_CRASHES = 5  # crashes with no delivery in between before the connection is failed


class Outcome(enum.Enum):
    RELEASE = "release"  # shutdown, or the connection was STOPPED: release with the final checkpoint
    LOST = "lost"  # the lease is gone (taken over, removed, self-fenced): write nothing more
    FAILED = "failed"  # the connection can never work as configured: mark it failed


@dataclass(frozen=True, slots=True)
class SessionResult:
    outcome: Outcome
    reason: str


class _SinkFailed(Exception):
    """Internal: the sink refused a batch; resubscribe after the last delivered seq."""


class _Ended(Exception):
    """Internal: the connection ended for `reason` (a close, a protocol error...): reconnect."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Stop(Exception):
    """Internal: leave the delivery loop with a result."""

    def __init__(self, result: SessionResult) -> None:
        super().__init__(result.reason)
        self.result = result


@dataclass(frozen=True, slots=True)
class SessionDeps:
    settings: Settings
    sink: Sink
    protocol: UpstreamProtocol
    metrics: WorkerMetrics
    tracing: Tracing


class ConnectionSession:
    def __init__(self, lease: Lease, deps: SessionDeps, record_failure: RecordFailure) -> None:
        self.lease = lease
        self.delivered_seq = lease.start_seq
        self.checkpointed_seq = lease.start_seq
        self.replays_dropped = 0  # overlapping replays (seq <= last accepted) dropped, §4.5
        self.crashes = 0  # consecutive crashes, reset by any delivery
        self._deps = deps
        self._settings = deps.settings
        self._failures = FailureRecorder(record_failure)
        self._ws: ClientConnection | None = None
        self._stop_requested = asyncio.Event()
        self._fence = LeaseFence(lease, self._on_deadline)
        self._batch = Batch()
        self._writes_at_once = writes_at_once(deps.sink)

    # ------------------------------------------------------------------ control, from the worker

    def request_release(self, reason: str) -> None:
        """Graceful: close the socket with 1001, deliver what was received, then release."""
        if self.lease.state is LeaseState.HELD:
            self.lease.state = LeaseState.RELEASING
            self.lease.end_reason = reason
        self._stop_requested.set()

    def lose(self, reason: str) -> None:
        """The lease is gone: abort the socket at once, no close handshake, deliver nothing."""
        self.lease.lose(reason)
        self._abort()
        self._stop_requested.set()

    # ------------------------------------------------------------------ the task

    async def run(self) -> SessionResult:
        with log_context(connection_id=self.lease.connection_id, epoch=self.lease.epoch):
            self._fence.arm()
            try:
                check_upstream_url(self.lease.ws_url, allow_insecure=self._settings.allow_insecure_ws)
                async with asyncio.TaskGroup() as group:
                    closer = group.create_task(self._close_on_request())
                    try:
                        return await self._deliver_forever()
                    finally:
                        self._stop_requested.set()
                        await closer
            except FatalUpstreamError as error:
                logger.error("connection can never work", extra={"reason": str(error)})
                return SessionResult(Outcome.FAILED, str(error))
            finally:
                self._fence.cancel()

    async def _deliver_forever(self) -> SessionResult:
        pacing = ReconnectPacing()
        crashed_at = self.delivered_seq
        while True:
            if self._stopping():
                return self._ending()
            try:
                reason = await self._attempt(pacing)
            except _Stop as stop:
                return stop.result
            except Exception as error:  # a bug or an input nobody foresaw: contained, counted
                if self.delivered_seq > crashed_at:
                    self.crashes = 0  # it delivered since the last crash: not "in a row"
                crashed_at = self.delivered_seq
                self.crashes += 1
                what = f"{type(error).__name__}: {error}"
                logger.exception(
                    "session crashed; keeping the lease and backing off", extra={"crashes": self.crashes}
                )
                if self.crashes >= MAX_CONSECUTIVE_CRASHES:
                    return SessionResult(Outcome.FAILED, f"session crashed {self.crashes} times: {what}")
                reason = f"session crashed: {what}"
            if self._stopping():
                return self._ending()
            await self._retry_later(reason, pacing.next_delay())

    async def _attempt(self, pacing: ReconnectPacing) -> str:
        """One connection: connect, subscribe, deliver until it ends. Returns why it ended."""
        with self._deps.tracing.span(
            "session.connect", connection_id=self.lease.connection_id, epoch=self.lease.epoch
        ):
            try:
                ws = await upstream.open_unless_stopped(self.lease.ws_url, self._stop_requested)
            except Exception as error:
                if is_fatal(error):
                    raise _Stop(SessionResult(Outcome.FAILED, f"{type(error).__name__}: {error}")) from None
                return f"connect failed: {type(error).__name__}: {error}"
        if ws is None:
            raise _Stop(self._ending())
        self._ws = ws
        pacing.connected()
        try:
            if self._stopping():
                # Stopped or fenced as the handshake completed: the closer saw no socket.
                raise _Stop(self._ending())
            await self._subscribe(ws)
            await self._stream(ws)
        except _Ended as ended:
            return ended.reason
        except _SinkFailed as error:
            return f"sink error: {error}"
        except ConnectionClosed as closed:  # wherever else it surfaces: still just a close
            return f"upstream closed: {closed}"
        finally:
            self._ws = None
            pacing.disconnected()
            self._batch.clear()  # undelivered records are fetched again after delivered_seq
            await self._close(ws)

    async def _subscribe(self, ws: ClientConnection) -> None:
        lease = self.lease
        try:
            for opening in self._deps.protocol.opening_frames(
                connection_id=lease.connection_id,
                after_seq=self.delivered_seq,
                epoch=lease.epoch,
                worker_id=lease.owner,
            ):
                await ws.send(opening)
        except ConnectionClosed as closed:
            raise _Ended(f"upstream closed before the subscribe was sent: {closed}") from None
        logger.info("subscribed", extra={"after_seq": self.delivered_seq, "url": lease.ws_url})

    async def _stream(self, ws: ClientConnection) -> NoReturn:
        """Deliver until the socket ends; raises _Ended with the reason."""
        decoder = self._deps.protocol.decoder(self.delivered_seq)
        batch = self._batch
        replayed = 0
        # Lingering (waiting up to BATCH_LINGER_SECONDS for more frames before a write) pays only
        # when frames come closer together than that. On a sparse stream every linger would end
        # in a timeout, whose cancellation costs more than the write it saves, so after a linger
        # that gathered nothing each record is written at once, until a frame arrives within a
        # linger of the last write: then lingering starts again.
        linger = True
        alone_at = -math.inf  # when a record was last written at once, without lingering
        try:
            while True:
                try:
                    if batch:
                        async with asyncio.timeout(batch.linger_left()):
                            raw = await ws.recv()
                    else:
                        raw = await ws.recv()
                except TimeoutError:
                    linger = len(batch) > 1
                    await self._deliver()
                    continue
                except ConnectionClosed as closed:
                    await self._deliver()
                    raise _Ended(await self._on_close(closed)) from None
                try:
                    frame = decoder.decode(raw)
                except ProtocolError as error:
                    await self._deliver()
                    raise _Ended(await self._protocol_error(str(error))) from None
                if isinstance(frame, ReplayedFrame):
                    if not replayed:  # once per subscription at once, the total when it ends
                        logger.info(
                            "overlapping replay: dropping frames already accepted",
                            extra={"seq": frame.seq, "last_seq": decoder.last_seq},
                        )
                    replayed += 1
                    self.replays_dropped += 1
                    self._deps.metrics.count(MetricName.ReplaysDropped)
                    continue
                if isinstance(frame, ErrorFrame):
                    await self._deliver()
                    raise _Ended(await self._error_frame(frame))
                assert isinstance(frame, DataFrame)
                size = frame_size(raw) if isinstance(raw, str) else len(raw)
                if not batch.fits(size):
                    await self._deliver()
                batch.add(self._record(frame), size)
                if not linger and len(batch) == 1:
                    now = time.monotonic()
                    linger = now - alone_at < BATCH_LINGER_SECONDS
                    alone_at = now
                if batch.full or not linger:
                    await self._deliver()
        finally:
            if replayed:
                logger.warning(
                    "overlapping replay dropped",
                    extra={"dropped": replayed, "dropped_total": self.replays_dropped},
                )

    def _record(self, frame: DataFrame) -> SinkRecord:
        lease = self.lease
        return SinkRecord(
            connection_id=lease.connection_id,
            seq=frame.seq,
            epoch=lease.epoch,
            worker_id=lease.owner,
            received_at_ms=time.time_ns() // 1_000_000,
            data=frame.data,
        )

    async def _on_close(self, closed: ConnectionClosed) -> str:
        broken = upstream.protocol_close(closed)
        if broken is not None:
            return await self._protocol_error(broken)
        return f"upstream closed: {closed}"

    async def _protocol_error(self, what: str) -> str:
        self._deps.metrics.count(MetricName.ProtocolErrors)
        logger.warning("protocol error; resubscribing", extra={"error": what})
        await self._failures(self.lease, f"protocol error: {what}")
        return f"protocol error: {what}"

    async def _error_frame(self, frame: ErrorFrame) -> str:
        if frame.code == STALE_EPOCH:
            # The upstream has seen a newer epoch: deliver nothing more. The item may still name
            # us, so the settler hands it back conditionally (review 2026-12-05, E).
            logger.warning("upstream says stale epoch", extra={"upstream_message": frame.message})
            self.lose(UPSTREAM_STALE_EPOCH)
            raise _Stop(SessionResult(Outcome.LOST, UPSTREAM_STALE_EPOCH))
        logger.warning("upstream error frame", extra={"code": frame.code, "upstream_message": frame.message})
        await self._failures(self.lease, f"upstream error {frame.code}: {frame.message}")
        return f"upstream error {frame.code}"

    async def _deliver(self) -> None:
        """Hand the batch to the sink if, and only if, the lease is still valid right now."""
        batch = self._batch.records
        if not batch:
            return
        self._batch.clear()
        now = time.monotonic()
        if not self.lease.is_valid(now):
            raise _Stop(self._ending())
        try:
            if self._writes_at_once:
                # Nothing to time: the write asks `valid` and ends within the call. (A timer per
                # write left a cancelled handle per message in the loop's heap, alive for the GC
                # until the lease's deadline.)
                await self._deps.sink.write(batch, valid=self._valid)
            else:
                # The write may not outlive the lease: past the deadline another epoch may deliver.
                with send_deadline(self.lease.valid_until):  # checked again at each socket write
                    async with asyncio.timeout(self.lease.valid_until - now):
                        await self._deps.sink.write(batch, valid=self._valid)
        except (SinkError, TimeoutError) as error:
            accepted = min(max(error.accepted, 0), len(batch)) if isinstance(error, SinkError) else 0
            self._delivered(batch[:accepted])
            self._deps.metrics.count(MetricName.SinkErrors)
            logger.error(
                "sink refused a batch; resubscribing",
                extra={"error": str(error) or "timeout", "accepted": accepted, "batch": len(batch)},
            )
            raise _SinkFailed(str(error) or "sink write timed out") from None
        self._delivered(batch)

    def _delivered(self, records: list[SinkRecord]) -> None:
        if records:
            self.delivered_seq = records[-1].seq
            self._deps.metrics.count(MetricName.MessagesDelivered, len(records))

    # ------------------------------------------------------------------ helpers

    def _valid(self) -> bool:
        return self.lease.is_valid(time.monotonic())

    def _stopping(self) -> bool:
        return self._stop_requested.is_set() or not self._valid()

    def _ending(self) -> SessionResult:
        if self.lease.state is LeaseState.RELEASING and time.monotonic() < self.lease.valid_until:
            return SessionResult(Outcome.RELEASE, self.lease.end_reason or "released")
        if self.lease.state is not LeaseState.LOST:
            self.lease.lose(DEADLINE_PASSED)
            self._deps.metrics.count(MetricName.SelfFenced)
            logger.warning("self-fenced: lease deadline passed without a renewal")
        return SessionResult(Outcome.LOST, self.lease.end_reason or "lost")

    async def _retry_later(self, reason: str, delay: float) -> None:
        self._deps.metrics.count(MetricName.Reconnects)
        logger.warning("reconnecting", extra={"reason": reason, "delay_s": round(delay, 3)})
        await self._failures(self.lease, reason)
        try:
            async with asyncio.timeout(delay):
                await self._stop_requested.wait()
        except TimeoutError:
            pass

    async def _close_on_request(self) -> None:
        await self._stop_requested.wait()
        ws = self._ws
        if ws is not None and self.lease.state is not LeaseState.LOST:
            await self._close(ws)

    async def _close(self, ws: ClientConnection) -> None:
        try:
            async with asyncio.timeout(upstream.CLOSE_TIMEOUT_SECONDS + 0.5):
                await ws.close(1001, "going away")
        except TimeoutError:
            ws.transport.abort()

    def _abort(self) -> None:
        if self._ws is not None:
            self._ws.transport.abort()

    def _on_deadline(self) -> None:
        """The local deadline passed without a renewal: abort the socket at once (§2d)."""
        self._abort()
        self._stop_requested.set()
