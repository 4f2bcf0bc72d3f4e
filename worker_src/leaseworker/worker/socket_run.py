"""One socket of a session: open it as the adapter asks, read it, and end it.

The adapter (protocol/adapter.py) decides everything about the feed; this module only does the
I/O it asks for to open the socket (references, the connect budget, the upgrade), to read it
(frames, timers, the batch's linger) and to end it (a close, a refusal, a stop). What the
adapter's actions do on the socket (sends, the sink batch, rotation) is worker/socket_actions.py.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from typing import NoReturn

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from leaseworker.clock import monotonic, wall_ns
from leaseworker.lease.model import LeaseState
from leaseworker.observability.logging import get_logger
from leaseworker.observability.metrics import MetricName
from leaseworker.protocol.adapter import Reconnect, SocketAdapter
from leaseworker.worker import connect_budget, upstream
from leaseworker.worker.backoff import ReconnectPacing, check_upstream_url, is_fatal
from leaseworker.worker.batch import frame_size
from leaseworker.worker.endings import Outcome, SessionResult, SinkFailed, Stop
from leaseworker.worker.receive_deadline import DEADLINE, ReceiveDeadline
from leaseworker.worker.socket_actions import SocketActions, SocketEnded

logger = get_logger(__name__)


LAPSED_TOKENS_AT_MOST = 3  # budget tokens that lapse before the upgrade, then a reconnect's backoff


def _wall_ms() -> int:
    return wall_ns() // 1_000_000


class SocketRun(SocketActions):
    async def attempt(self, pacing: ReconnectPacing) -> tuple[str, bool]:
        """One connection: open, run the open steps, deliver until it ends. Returns why it ended
        and whether that counts as a failure at this position.

        An upstream may echo what it was sent (a token in an error frame, a close reason, a URL
        in an exception): every reason that leaves here, and every log line about this socket,
        has the socket's resolved values replaced by "***" (docs/design.md §4.2 "Secrets")."""
        try:
            reason, counts = await self._attempt(pacing)
        except Stop as stop:
            outcome, reason = stop.result.outcome, self._scrub(stop.result.reason)
            raise Stop(SessionResult(outcome, reason)) from None
        return self._scrub(reason), counts

    async def _attempt(self, pacing: ReconnectPacing) -> tuple[str, bool]:
        s = self.s
        protocol = s.protocol
        assert protocol is not None
        refs = protocol.references()
        self._values = ()
        try:
            values = await s.deps.references.resolve(refs) if refs else {}
        except ValueError as error:  # UnresolvedReference, ConfigError: as configured, it cannot work
            return f"unresolved reference: {error}", True
        except Exception as error:  # SecretsUnavailable: throttled, unreachable; try again later
            return f"secrets unavailable: {error}", False
        self._values = tuple(values.values())
        adapter = self._adapter(values, self._resume(s.open_reason))
        request = adapter.connect_request()
        check_upstream_url(request.display_url, allow_insecure=s.settings.allow_insecure_ws)
        limit = connect_budget.limit_of(s, request.url)
        for _ in range(LAPSED_TOKENS_AT_MOST):
            send_by = await connect_budget.wait_for_token(s, limit)
            if send_by is None:
                raise Stop(s.ending())
            with s.deps.tracing.span(
                "session.connect", connection_id=s.lease.connection_id, epoch=s.lease.epoch
            ):
                try:
                    ws = await s.deps.open_socket(replace(request, send_by=send_by), s.stop_requested)
                except upstream.TokenLapsed as lapsed:
                    logger.info(
                        "connect budget token lapsed before the upgrade; taking another",
                        extra={"why": str(lapsed)},
                    )
                    continue
                except Exception as error:
                    if is_fatal(error):
                        reason = self._scrub(f"{type(error).__name__}: {error}")  # the span records it too
                        raise Stop(SessionResult(Outcome.FAILED, reason)) from None
                    status = upstream.refusal_status(error)
                    if status is not None:
                        await connect_budget.obey_refusal(
                            s, limit, status, upstream.refusal_retry_after(error)
                        )
                        try:
                            await self._perform(
                                None, adapter, adapter.on_close(None, f"HTTP {status}", _wall_ms())
                            )
                        except SocketEnded as ended:
                            self._on_refusal(ended, refs)
                            return ended.reason, ended.counts
                    return f"connect failed: {type(error).__name__}: {error}", False
            break
        else:
            return (
                f"connect failed: {LAPSED_TOKENS_AT_MOST} budget tokens lapsed before the upgrade was sent",
                False,
            )
        if ws is None:
            raise Stop(s.ending())
        s.track_socket(ws.transport)
        pacing.connected()
        self._ws = s.current_ws = ws
        closer = asyncio.ensure_future(self._close_on_stop())
        self._display_url = request.display_url
        try:
            if s.stopping():
                raise Stop(s.ending())  # stopped or fenced as the handshake completed
            await self._perform(ws, adapter, adapter.on_open(monotonic(), _wall_ms()))
            await self._stream(ws, adapter, refs)
        except SocketEnded as ended:
            self._on_refusal(ended, refs)
            return ended.reason, ended.counts
        except SinkFailed as error:  # counts only if the same record can never be accepted
            return f"sink error: {error}", error.permanent
        except ConnectionClosed as closed:  # wherever else it surfaces: still just a close
            return f"upstream closed: {closed}", False
        finally:
            if self._dropped:
                logger.warning(
                    "overlapping replay dropped",
                    extra={"dropped": self._dropped, "dropped_total": s.replays_dropped},
                )
            closer.cancel()
            current = self._ws
            s.current_ws = None
            s.untrack_socket(current.transport)
            pacing.disconnected()
            s.clear_batch()  # undelivered records are fetched again after delivered_seq
            s.deps.closes.close(current)  # nothing more is read from it: its handshake is not waited for
        raise AssertionError("unreachable")  # _stream only ends by raising

    def _on_refusal(self, ended: SocketEnded, refs: frozenset[str]) -> None:
        if ended.reason.startswith("auth refused") and refs:
            self.s.deps.references.invalidate(refs)  # a rotated secret is read again

    async def _stream(self, ws: ClientConnection, adapter: SocketAdapter, refs: frozenset[str]) -> None:
        s = self.s
        receiving = ReceiveDeadline()  # one lazily moved timer, not one per frame
        try:
            while True:
                deadline = s.batch.linger_deadline if s.batch else math.inf
                timer = adapter.next_timer()
                if timer is not None and timer < deadline:
                    deadline = timer
                try:
                    raw = await (ws.recv() if deadline == math.inf else receiving.receive(ws, deadline))
                except ConnectionClosed as closed:
                    await s.deliver()
                    await self._closed(ws, adapter, closed)
                if raw is DEADLINE:
                    now = monotonic()
                    timer = adapter.next_timer()
                    if timer is not None and now >= timer:
                        ws, adapter = await self._perform(ws, adapter, adapter.on_timer(now, _wall_ms()))
                    if s.batch and s.batch.linger_left() <= 0:
                        self._linger = len(s.batch) > 1
                        await s.deliver()
                    continue
                assert isinstance(raw, (str, bytes))
                size = frame_size(raw) if isinstance(raw, str) else len(raw)
                ws, adapter = await self._perform(
                    ws, adapter, adapter.on_frame(raw, monotonic(), _wall_ms()), size
                )
        finally:
            receiving.close()

    async def _closed(
        self, ws: ClientConnection, adapter: SocketAdapter, closed: ConnectionClosed
    ) -> NoReturn:
        """The socket closed under a receive: a protocol error, or the adapter's reading of the close."""
        s = self.s
        broken = upstream.protocol_close(closed)
        if broken is not None:
            s.deps.metrics.count(MetricName.ProtocolErrors)
            logger.warning("protocol error; resubscribing", extra={"error": self._scrub(broken)})
            raise SocketEnded(f"protocol error: {broken}", True) from None
        code = closed.rcvd.code if closed.rcvd is not None else None
        reason = closed.rcvd.reason if closed.rcvd is not None else "no close frame"
        actions = [
            Reconnect(f"upstream closed: {closed}", a.kind, a.next_open)
            if isinstance(a, Reconnect) and a.kind == "closed"
            else a
            for a in adapter.on_close(code, reason, _wall_ms())
        ]
        await self._perform(ws, adapter, actions)
        raise SocketEnded(f"upstream closed: {closed}", False) from None

    async def _close_on_stop(self) -> None:
        s = self.s
        await s.stop_requested.wait()
        if s.lease.state is not LeaseState.LOST:
            await upstream.close_socket(self._ws)
