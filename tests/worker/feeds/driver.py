"""A small session loop for tests: drives a protocol's Sans-I/O adapter over real WebSockets the
way the worker's session does (connect with the ConnectRequest, on_open / on_frame / on_timer /
on_close, perform Send, collect Emit and Gap as numbered records, resume each new socket from
the last delivered checkpoint), without a lease, a sink or a backoff policy."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from leaseworker.protocol.adapter import (
    Action,
    Dropped,
    Emit,
    Fail,
    Gap,
    OpenReason,
    Ready,
    Reconnect,
    Release,
    Resume,
    Rotate,
    Send,
    SocketContext,
    UpstreamProtocol,
)

RECONNECT_DELAY_S = 0.05


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Record:
    seq: int
    kind: str  # data | gap | raw
    data: Any
    cursor: Any = None
    key: str | None = None
    received_at_ms: int = 0


@dataclass
class Driver:
    protocol: UpstreamProtocol
    values: Mapping[str, str] = field(default_factory=dict)
    connection_id: str = "c1"
    epoch: int = 1
    records: list[Record] = field(default_factory=list)
    ends: list[Reconnect | Fail | Release] = field(default_factory=list)
    sent: list[str | bytes] = field(default_factory=list)
    dropped: int = 0
    readies: int = 0
    rotations: int = 0
    checkpoint: Any = None
    last_ms: int | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    # -- what tests read ---------------------------------------------------------------------

    def data(self) -> list[Record]:
        return [r for r in self.records if r.kind == "data"]

    def gaps(self) -> list[Record]:
        return [r for r in self.records if r.kind == "gap"]

    async def wait_for(self, predicate: Callable[[Driver], bool], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate(self):
                self._changed.clear()
                await self._changed.wait()

    # -- the loop ----------------------------------------------------------------------------

    async def run(self, *, max_sockets: int = 20) -> None:
        """Open sockets one after another until cancelled, a Fail, or max_sockets."""
        reason: OpenReason = "connect"
        for _ in range(max_sockets):
            end = await self._socket(reason)
            self.ends.append(end)
            self._changed.set()
            if not isinstance(end, Reconnect):
                return
            reason = end.next_open
            await asyncio.sleep(RECONNECT_DELAY_S)

    async def _socket(self, reason: OpenReason) -> Reconnect | Fail | Release:
        resume = Resume(cursor=self.checkpoint, seq=len(self.records) - 1, at_ms=self.last_ms, reason=reason)
        context = SocketContext(self.connection_id, self.epoch, "test-worker", resume, self.values)
        adapter = self.protocol.adapter(context, time.monotonic())
        request = adapter.connect_request()
        try:
            ws = await connect(
                request.url,
                additional_headers=list(request.headers),
                subprotocols=list(request.subprotocols) or None,  # type: ignore[arg-type]
                compression="deflate" if request.compression else None,
                max_size=request.max_frame_bytes,
                ping_interval=request.ping_interval_s,
                ping_timeout=request.ping_timeout_s,
                open_timeout=5,
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            return self._first_end(adapter.on_close(None, f"HTTP {status}", wall_ms()))
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            return self._first_end(adapter.on_close(None, str(exc), wall_ms()))
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(ws.close)
            end = await self._perform(ws, adapter.on_open(time.monotonic(), wall_ms()))
            while end is None:
                deadline = adapter.next_timer()
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    async with asyncio.timeout(timeout):
                        frame = await ws.recv()
                except TimeoutError:
                    end = await self._perform(ws, adapter.on_timer(time.monotonic(), wall_ms()))
                    continue
                except ConnectionClosed:
                    rcvd = ws.protocol.close_rcvd
                    code = rcvd.code if rcvd is not None else None
                    said = rcvd.reason if rcvd is not None else ""
                    end = self._first_end(adapter.on_close(code, said, wall_ms()))
                    break
                end = await self._perform(ws, adapter.on_frame(frame, time.monotonic(), wall_ms()))
            return end
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _first_end(actions: Sequence[Action]) -> Reconnect | Fail | Release:
        for action in actions:
            if isinstance(action, Reconnect | Fail | Release):
                return action
        return Reconnect("closed without an end action")

    async def _perform(
        self, ws: ClientConnection, actions: Sequence[Action]
    ) -> Reconnect | Fail | Release | None:
        for action in actions:
            if isinstance(action, Send):
                self.sent.append(action.frame)
                with contextlib.suppress(ConnectionClosed):
                    await ws.send(action.frame)
            elif isinstance(action, Emit):
                now = wall_ms()
                self.records.append(
                    Record(len(self.records), action.kind, action.data, action.cursor, action.key, now)
                )
                self.checkpoint = action.checkpoint
                self.last_ms = now
            elif isinstance(action, Gap):
                self.records.append(
                    Record(len(self.records), "gap", action.data(), None, action.key, wall_ms())
                )
            elif isinstance(action, Ready):
                self.readies += 1
            elif isinstance(action, Dropped):
                self.dropped += action.count
            elif isinstance(action, Rotate):
                self.rotations += 1  # make-before-break is the session's; not modelled here
            else:
                self._changed.set()
                return action
        self._changed.set()
        return None


async def start(driver: Driver, **run: Any) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(driver.run(**run))


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
