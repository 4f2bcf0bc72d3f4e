"""One session task per owned connection: connect, subscribe after the checkpoint, deliver.

The session never decides ownership; it obeys it. Before every sink write it checks the lease's
local monotonic deadline (DESIGN.md §2d), and a timer aborts the socket the instant that deadline
passes, so a worker that wakes from a pause past its deadline delivers nothing. Checkpoints are
written by the worker's checkpoint loop from `delivered_seq`, which only moves after the sink
has acknowledged.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode

from leaseworker.lease.errors import StoreError
from leaseworker.lease.model import Lease, LeaseState
from leaseworker.observability.logging import get_logger, log_context
from leaseworker.observability.metrics import MetricName, WorkerMetrics
from leaseworker.observability.tracing import Tracing
from leaseworker.protocol.base import DataFrame, ErrorFrame, ProtocolError, UpstreamProtocol
from leaseworker.protocol.seqfeed import MAX_FRAME_BYTES, STALE_EPOCH
from leaseworker.records import SinkRecord
from leaseworker.settings import Settings
from leaseworker.sinks.base import Sink, SinkError
from leaseworker.worker.backoff import FatalUpstreamError, backoff, check_upstream_url, is_fatal

logger = get_logger(__name__)

BATCH_MAX_RECORDS = 200
BATCH_LINGER_SECONDS = 0.02
OPEN_TIMEOUT_SECONDS = 10.0
CLOSE_TIMEOUT_SECONDS = 2.0
FAILURE_RECORD_INTERVAL_SECONDS = 5.0


class Outcome(enum.Enum):
    RELEASE = "release"  # shutdown, or the connection was STOPPED: release with the final checkpoint
    LOST = "lost"  # the lease is gone (taken over, removed, self-fenced): write nothing more
    FAILED = "failed"  # the connection can never work as configured: mark it failed


@dataclass(frozen=True, slots=True)
class SessionResult:
    outcome: Outcome
    reason: str


RecordFailure = Callable[[Lease, str], Awaitable[bool]]


class _SinkFailed(Exception):
    """Internal: the sink refused a batch; resubscribe after the last delivered seq."""


class _Stop(Exception):
    """Internal: leave the delivery loop with a result."""

    def __init__(self, result: SessionResult) -> None:
        super().__init__(result.reason)
        self.result = result


class FailureRecorder:
    """Writes `last_error`/`failures` on the item, conditioned on the lease, at a bounded rate."""

    def __init__(self, record: RecordFailure) -> None:
        self._record = record
        self._last = -FAILURE_RECORD_INTERVAL_SECONDS

    async def __call__(self, lease: Lease, reason: str) -> None:
        now = time.monotonic()
        if now - self._last < FAILURE_RECORD_INTERVAL_SECONDS:
            return
        self._last = now
        try:
            await self._record(lease, reason)
        except StoreError as error:
            logger.warning("could not record failure", extra={"error": str(error)})


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
        self._deps = deps
        self._settings = deps.settings
        self._failures = FailureRecorder(record_failure)
        self._ws: ClientConnection | None = None
        self._stop_requested = asyncio.Event()
        self._fence_timer: asyncio.TimerHandle | None = None

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
            self._arm_fence()
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
                if self._fence_timer is not None:
                    self._fence_timer.cancel()

    async def _deliver_forever(self) -> SessionResult:
        delays = backoff()
        while True:
            if self._stop_requested.is_set() or not self._valid():
                return self._ending()
            try:
                with self._deps.tracing.span(
                    "session.connect", connection_id=self.lease.connection_id, epoch=self.lease.epoch
                ):
                    ws = await connect(
                        self.lease.ws_url,
                        open_timeout=OPEN_TIMEOUT_SECONDS,
                        close_timeout=CLOSE_TIMEOUT_SECONDS,
                        max_size=MAX_FRAME_BYTES,
                    )
            except Exception as error:
                if is_fatal(error):
                    return SessionResult(Outcome.FAILED, f"{type(error).__name__}: {error}")
                await self._retry_later(f"connect failed: {type(error).__name__}: {error}", next(delays))
                continue
            self._ws = ws
            if self._stop_requested.is_set() or not self._valid():
                # Stopped or fenced while the handshake was in flight: the closer saw no socket.
                self._ws = None
                await self._close(ws)
                return self._ending()
            try:
                delivered_before = self.delivered_seq
                reason = await self._stream(ws)
            except _SinkFailed as error:
                reason = f"sink error: {error}"
            except _Stop as stop:
                return stop.result
            finally:
                self._ws = None
                await self._close(ws)
            if self.delivered_seq > delivered_before:
                delays = backoff()  # a connection that delivered resets the backoff
            if self._stop_requested.is_set() or not self._valid():
                return self._ending()
            await self._retry_later(reason, next(delays))

    async def _stream(self, ws: ClientConnection) -> str:
        """Subscribe and deliver until the socket ends; returns why it ended."""
        lease = self.lease
        for opening in self._deps.protocol.opening_frames(
            connection_id=lease.connection_id,
            after_seq=self.delivered_seq,
            epoch=lease.epoch,
            worker_id=lease.owner,
        ):
            await ws.send(opening)
        logger.info("subscribed", extra={"after_seq": self.delivered_seq, "url": lease.ws_url})
        decoder = self._deps.protocol.decoder(self.delivered_seq)
        batch: list[SinkRecord] = []
        first_at = 0.0
        while True:
            try:
                if batch:
                    async with asyncio.timeout(first_at + BATCH_LINGER_SECONDS - time.monotonic()):
                        raw = await ws.recv()
                else:
                    raw = await ws.recv()
            except TimeoutError:
                await self._deliver(batch)
                continue
            except ConnectionClosed as closed:
                await self._deliver(batch)
                if closed.sent is not None and closed.sent.code == CloseCode.MESSAGE_TOO_BIG:
                    # websockets refused a frame over MAX_FRAME_BYTES before buffering it.
                    self._deps.metrics.count(MetricName.ProtocolErrors)
                    await self._failures(
                        lease, f"protocol error: oversized frame (> {MAX_FRAME_BYTES} bytes)"
                    )
                    return "protocol error: oversized frame"
                return f"upstream closed: {closed}"
            try:
                frame = decoder.decode(raw)
            except ProtocolError as error:
                await self._deliver(batch)
                self._deps.metrics.count(MetricName.ProtocolErrors)
                logger.warning("protocol error; resubscribing", extra={"error": str(error)})
                await self._failures(lease, f"protocol error: {error}")
                return f"protocol error: {error}"
            if isinstance(frame, ErrorFrame):
                await self._deliver(batch)
                if frame.code == STALE_EPOCH:
                    # The upstream has seen a newer epoch: someone else owns this connection now.
                    self.lose(f"upstream says stale epoch: {frame.message}")
                    raise _Stop(SessionResult(Outcome.LOST, "stale epoch"))
                logger.warning(
                    "upstream error frame", extra={"code": frame.code, "upstream_message": frame.message}
                )
                await self._failures(lease, f"upstream error {frame.code}: {frame.message}")
                return f"upstream error {frame.code}"
            assert isinstance(frame, DataFrame)
            if not batch:
                first_at = time.monotonic()
            batch.append(
                SinkRecord(
                    connection_id=lease.connection_id,
                    seq=frame.seq,
                    epoch=lease.epoch,
                    worker_id=lease.owner,
                    received_at_ms=time.time_ns() // 1_000_000,
                    data=frame.data,
                )
            )
            if len(batch) >= BATCH_MAX_RECORDS:
                await self._deliver(batch)

    async def _deliver(self, batch: list[SinkRecord]) -> None:
        """Hand `batch` to the sink if, and only if, the lease is still valid right now."""
        if not batch:
            return
        now = time.monotonic()
        if not self.lease.is_valid(now):
            batch.clear()
            raise _Stop(self._ending())
        try:
            # The write may not outlive the lease: past the deadline another epoch may deliver.
            async with asyncio.timeout(self.lease.valid_until - now):
                await self._deps.sink.write(batch, valid=self._valid)
        except (SinkError, TimeoutError) as error:
            self._deps.metrics.count(MetricName.SinkErrors)
            logger.error("sink refused a batch; resubscribing", extra={"error": str(error) or "timeout"})
            batch.clear()
            raise _SinkFailed(str(error) or "sink write timed out") from None
        self.delivered_seq = batch[-1].seq
        self._deps.metrics.count(MetricName.MessagesDelivered, len(batch))
        batch.clear()

    # ------------------------------------------------------------------ helpers

    def _valid(self) -> bool:
        return self.lease.is_valid(time.monotonic())

    def _ending(self) -> SessionResult:
        if self.lease.state is LeaseState.RELEASING and time.monotonic() < self.lease.valid_until:
            return SessionResult(Outcome.RELEASE, self.lease.end_reason or "released")
        if self.lease.state is not LeaseState.LOST:
            self.lease.lose("local deadline passed")
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
            async with asyncio.timeout(CLOSE_TIMEOUT_SECONDS + 0.5):
                await ws.close(1001, "going away")
        except TimeoutError:
            ws.transport.abort()

    def _abort(self) -> None:
        if self._ws is not None:
            self._ws.transport.abort()

    def _arm_fence(self) -> None:
        """Abort the socket the moment the local deadline passes without a renewal."""
        loop = asyncio.get_running_loop()

        def check() -> None:
            now = time.monotonic()
            if self.lease.state is LeaseState.LOST:
                return
            if now >= self.lease.valid_until:
                self._abort()
                self._stop_requested.set()
                return
            self._fence_timer = loop.call_at(self._loop_time(loop, self.lease.valid_until), check)

        self._fence_timer = loop.call_at(self._loop_time(loop, self.lease.valid_until), check)

    @staticmethod
    def _loop_time(loop: asyncio.AbstractEventLoop, monotonic_deadline: float) -> float:
        return loop.time() + (monotonic_deadline - time.monotonic())
