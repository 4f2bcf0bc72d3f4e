"""What an adapter's actions do on one socket (worker/socket_run.py opens it and reads it).

The adapter (protocol/adapter.py) decides everything about the feed; this module only does the
I/O its actions ask for: sends, the sink batch, the end of the socket, and make-before-break
rotation (`Rotate`): the successor socket is opened and its open steps are done while the old
one still delivers; then the old one is closed, and the successor's records that the old socket
already delivered (an ordered cursor at or below the last one delivered for its key) are dropped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from leaseworker.clock import monotonic
from leaseworker.lease.model import UPSTREAM_STALE_EPOCH
from leaseworker.observability.logging import get_logger
from leaseworker.observability.metrics import MetricName
from leaseworker.protocol.adapter import (
    Action,
    Dropped,
    Emit,
    Fail,
    Gap,
    Ready,
    Reconnect,
    Release,
    Resume,
    Rotate,
    Send,
    SocketAdapter,
    SocketContext,
)
from leaseworker.secret_references import redact
from leaseworker.worker import connect_budget
from leaseworker.worker.batch import BATCH_LINGER_SECONDS
from leaseworker.worker.checkpoint_cursor import CursorTooLarge
from leaseworker.worker.endings import Outcome, SessionResult, Stop
from leaseworker.worker.rotation import open_successor
from leaseworker.worker.session import ConnectionSession

logger = get_logger(__name__)


GAP_RECORD_BYTES = 256  # a gap marker's size in the batch accounting
# Which endings count toward failing the connection at one position: a frame that breaks the
# protocol and an auth refusal will not go away by themselves; a close, a connection limit or an
# upstream's error frame (`unavailable`, `try again`) may.
_COUNTS: dict[str, bool] = {"closed": False, "limit": False, "protocol": True, "auth": True, "error": False}


class SocketEnded(Exception):
    """The socket ended for `reason`; `counts`: a failure at this position (poison, refusal)."""

    def __init__(self, reason: str, counts: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.counts = counts


def _comparable(a: Any, b: Any) -> bool:
    numbers = (int, float)
    if isinstance(a, bool) or isinstance(b, bool):
        return False
    return (isinstance(a, numbers) and isinstance(b, numbers)) or (isinstance(a, str) and isinstance(b, str))


class SocketActions:
    """One socket's state, and what the adapter's actions do to it and to the session's batch."""

    def __init__(self, session: ConnectionSession) -> None:
        self.s = session
        self._linger = True
        self._alone_at = -math.inf
        self._overlap: dict[str | None, Any] | None = None  # after a rotation: last cursor per key
        self._last_cursor: dict[str | None, Any] = {}
        self._ws: ClientConnection
        self._display_url = ""
        self._ready = False  # the current socket's open steps are done
        self._dropped = 0  # overlapping replays dropped on this socket
        self._values: tuple[str, ...] = ()  # the current socket's resolved references

    def _adapter(self, values: dict[str, str], resume: Resume) -> SocketAdapter:
        s = self.s
        protocol = s.protocol
        assert protocol is not None
        context = SocketContext(s.lease.connection_id, s.lease.epoch, s.lease.owner, resume, values)
        return protocol.adapter(context, monotonic())

    def _resume(self, reason: Any) -> Resume:
        s = self.s
        cursor = s.batch_cursors[-1] if s.batch_cursors else s.delivered_cursor
        return Resume(
            cursor=None if cursor is None else json.loads(cursor),
            seq=s.delivered_seq + len(s.batch),
            at_ms=s.delivered_at_ms,
            reason=reason,
        )

    def _scrub(self, text: str) -> str:
        return redact(text, self._values)

    async def _perform(
        self, ws: ClientConnection | None, adapter: SocketAdapter, actions: Sequence[Action], size: int = 0
    ) -> tuple[Any, SocketAdapter]:
        s = self.s
        records = sum(1 for a in actions if isinstance(a, Emit))
        per_record = size // records if records else 0
        added = False
        for action in actions:
            if isinstance(action, Emit):
                if self._overlapping(action):
                    s.replays_dropped += 1
                    s.deps.metrics.count(MetricName.ReplaysDropped)
                    continue
                if not s.batch.fits(per_record):
                    await s.deliver()
                try:
                    s.add_record(
                        action.kind,
                        action.data,
                        cursor=action.cursor,
                        key=action.key,
                        checkpoint=action.checkpoint,
                        size=per_record,
                    )
                except CursorTooLarge as error:
                    await s.deliver()  # what came before is delivered and checkpointed first
                    raise Stop(SessionResult(Outcome.FAILED, str(error))) from None
                if action.cursor is not None:
                    self._last_cursor[action.key] = action.cursor
                added = True
            elif isinstance(action, Gap):
                s.add_record(
                    "gap", action.data(), cursor=None, key=action.key, checkpoint=None, size=GAP_RECORD_BYTES
                )
                added = True
            elif isinstance(action, Send):
                if ws is not None:
                    try:
                        await ws.send(action.frame)
                    except ConnectionClosed as closed:
                        when = "while we sent" if self._ready else "before the subscribe was sent"
                        raise SocketEnded(f"upstream closed {when}: {closed}", False) from None
            elif isinstance(action, Ready):
                self._ready = True
                logger.info(
                    "subscribed",
                    extra={
                        "after_seq": s.delivered_seq,
                        "url": self._display_url,
                        "protocol": s.lease.protocol,
                    },
                )
            elif isinstance(action, Dropped):
                if not self._dropped:  # once per socket at once, the total when it ends
                    logger.info("overlapping replay: dropping frames already accepted")
                self._dropped += action.count
                s.replays_dropped += action.count
                s.deps.metrics.count(MetricName.ReplaysDropped, action.count)
            elif isinstance(action, Reconnect):
                await s.deliver()
                if s.open_reason == "reconnect":
                    s.open_reason = action.next_open
                if action.kind == "protocol":
                    s.deps.metrics.count(MetricName.ProtocolErrors)
                    logger.warning(
                        "protocol error; resubscribing", extra={"error": self._scrub(action.reason)}
                    )
                elif action.kind == "error":
                    logger.warning("upstream error frame", extra={"error": self._scrub(action.reason)})
                elif action.kind in ("auth", "limit"):
                    shown = self._scrub(action.reason)
                    logger.warning("upstream refused us", extra={"error": shown, "kind": action.kind})
                raise SocketEnded(action.reason, _COUNTS.get(action.kind, True))
            elif isinstance(action, Fail):
                await s.deliver()
                raise Stop(SessionResult(Outcome.FAILED, action.reason))
            elif isinstance(action, Release):
                # Another epoch owns it: deliver nothing more under ours. The item may still name
                # us (session-held items never expire), so the settler hands it back, conditional
                # on owner and epoch, with what the sink accepted (review 2026-12-05, E).
                s.clear_batch()
                logger.warning(
                    "upstream says stale epoch", extra={"upstream_message": self._scrub(action.reason)}
                )
                s.lose(UPSTREAM_STALE_EPOCH)
                raise Stop(SessionResult(Outcome.LOST, UPSTREAM_STALE_EPOCH))
            elif isinstance(action, Rotate) and ws is not None:
                ws, adapter = await self._rotate(ws, adapter)
        if added:
            await self._after_add()
        return ws, adapter

    def _overlapping(self, emit: Emit) -> bool:
        """After a rotation: a record the old socket already delivered (ordered cursor)."""
        if self._overlap is None or emit.cursor is None:
            return False
        last = self._overlap.get(emit.key)
        if last is None or not _comparable(emit.cursor, last):
            return False
        if emit.cursor <= last:
            return True
        self._overlap.pop(emit.key, None)  # past the overlap for this key
        return False

    async def _after_add(self) -> None:
        s = self.s
        if not self._linger and len(s.batch) == 1:
            now = monotonic()
            self._linger = now - self._alone_at < BATCH_LINGER_SECONDS
            self._alone_at = now
        if s.batch.full or not self._linger:
            await s.deliver()

    async def _rotate(self, old: ClientConnection, old_adapter: SocketAdapter) -> tuple[Any, SocketAdapter]:
        """Make before break: the successor is subscribed before the old socket closes. If it
        cannot be (it did not open, or its open steps failed), or a stop came before the switch,
        the old socket carries on."""
        s = self.s
        limit = connect_budget.limit_of(s, self._display_url)
        send_by = await connect_budget.wait_for_token(s, limit, rotation=True)
        if send_by is None:
            return old, old_adapter
        successor = await open_successor(
            s, lambda values: self._adapter(values, self._resume("rotation")), send_by=send_by
        )
        if successor is None:
            return old, old_adapter
        new, adapter, pending = successor
        await s.deliver()
        if s.stop_requested.is_set():
            # The closer closes whichever socket is current when a stop comes: here that was the
            # old one. Keep it, so the session ends on it as on any stop (what it received is
            # read and delivered first); the successor never became current, so close it here.
            # No await between this check and the switch below: a later stop closes the successor.
            s.deps.closes.close(new)  # never read: its close may wait behind what it received
            return old, old_adapter
        s.untrack_socket(old.transport)
        s.track_socket(new.transport)
        self._ws = s.current_ws = new
        s.deps.closes.close(old)  # no longer read: the successor's frames are not held up by its close
        self._overlap = dict(self._last_cursor)  # what the old socket delivered, per key
        logger.info("rotated the socket", extra={"url": self._display_url})
        return await self._perform(new, adapter, pending)
