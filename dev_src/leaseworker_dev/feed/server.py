"""A local `seqfeed/1` upstream (docs/design.md §4) for tests and the local demo.

Every connection id has a synthetic, deterministic stream. Its head (the highest seq that exists)
grows at `rate` messages per second from the moment the id is first subscribed, and the data for
seq n is a pure function of (id, n), so the server keeps no history and any replay is exact:

    head(t) = base_seq + floor((t - base_time) * rate)        base_seq = -1 when the id is new
    data(n) = {"n": n, "connection_id": id}

A subscribe after N replays N+1..head at once, then sends live frames as the head grows. Each
session has one timer: it sleeps until the next seq exists (at least MIN_TICK, so a high rate is
sent in batches rather than one wake-up per message).

Epoch fencing: the highest epoch seen per id is remembered. A subscribe with a lower epoch gets
`{"type":"error","code":"stale_epoch",...}` and a close (1008); an equal epoch is the same owner
reconnecting and is served. A lower-epoch session that is already open is NOT kicked when a higher
epoch subscribes (unless `kick_stale=True`): the tests must be able to catch a worker that keeps
delivering after it lost its lease, which a kicking upstream would hide.

Session log (optional, one JSON object per line, flushed per event):
    {"t_ms", "event": "open"|"subscribe"|"reject"|"close", "session", "connection_id", "epoch",
     "worker_id", "after_seq", "last_sent_seq", "code", "reason"}
Every key is present on every line (null when unknown). Every `open` is followed by exactly one
`close`, including abnormal ones (close `code` is the WebSocket close code, 1006 when the TCP
connection dropped); `reject` carries the error code (`stale_epoch`, `bad_request`).
`last_sent_seq` is the highest seq whose frame was handed to the transport (null if none).

Fault modes, per URL `?mode=`:
- after FAULT_AFTER valid frames: `garbage` (not JSON), `gap` (one seq skipped, then carries on),
  `oversized` (a frame over MAX_FRAME_BYTES), `deep` (JSON nested DEEP_NESTING levels, 200 KB),
  `surrogate` (a valid frame whose data holds a lone surrogate escape, then carries on);
  the broken ones leave the stream open, so the client must notice on its own;
- `close` (right after subscribe), `error` (error frame `unavailable`, then close 1013);
- `drop`: one frame, then the TCP connection is aborted (every time);
- `replay`: every FAULT_AFTER frames are sent twice in a row (an overlapping replay, forever).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, Self, TypeGuard
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode

from leaseworker.protocol.seqfeed import MAX_FRAME_BYTES, STALE_EPOCH

log = logging.getLogger(__name__)

FaultMode = Literal["garbage", "close", "gap", "oversized", "error", "deep", "surrogate", "drop", "replay"]
FAULT_MODES: Final[frozenset[str]] = frozenset(
    {"garbage", "close", "gap", "oversized", "error", "deep", "surrogate", "drop", "replay"}
)
FAULT_AFTER: Final = 3  # valid frames sent before a garbage/gap/oversized/deep/surrogate fault
DEEP_NESTING: Final = 100_000  # levels of `[` in a `deep` frame: too deep for any recursive parser
LONE_SURROGATE: Final = "\\ud800"  # JSON text for a lone surrogate, which no UTF-8 encoder accepts
MIN_TICK: Final = 0.01  # shortest sleep between live batches, in seconds
MAX_TICK: Final = 1.0  # longest sleep, so a per-URL rate change is picked up promptly
CLOSE_TIMEOUT: Final = 1.0  # seconds to wait for the close handshake before aborting
SUBSCRIBE_TIMEOUT: Final = 10.0  # seconds a client has to send its subscribe frame
REPLAY_YIELD_EVERY: Final = 256  # frames sent between yields to the loop during a long replay
BAD_REQUEST: Final = "bad_request"
UNAVAILABLE: Final = "unavailable"
GARBAGE_FRAME: Final = "this is not JSON {"

_FEED_PATH = re.compile(r"/feeds/([^/]+)/?")
_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def data_for(connection_id: str, seq: int) -> dict[str, Any]:
    """The payload of `seq` in `connection_id`'s stream (deterministic)."""
    return {"n": seq, "connection_id": connection_id}


def data_frame(connection_id: str, seq: int) -> str:
    """`{"type":"data","seq":n,"data":data_for(id, n)}` as compact JSON, formatted directly: the
    feed sends one per message, and a subscribed id matches _ID, so it needs no escaping."""
    return f'{{"type":"data","seq":{seq},"data":{{"n":{seq},"connection_id":"{connection_id}"}}}}'


def error_frame(code: str, message: str) -> str:
    return json.dumps({"type": "error", "code": code, "message": message}, separators=(",", ":"))


class BadRequest(Exception):
    """The client's URL or subscribe frame is malformed; str() is the reason sent back."""


@dataclass
class _Stream:
    """One connection id's synthetic stream and its fencing state."""

    rate: float
    base_time: float
    base_seq: int = -1
    max_epoch: int = -1
    sessions: set[_Session] = field(default_factory=set)

    def head(self, now: float) -> int:
        if self.rate <= 0:
            return self.base_seq
        return self.base_seq + math.floor((now - self.base_time) * self.rate)

    def time_of(self, seq: int) -> float:
        """When `seq` comes into existence (inf if the stream does not grow)."""
        if self.rate <= 0:
            return math.inf
        return self.base_time + (seq - self.base_seq) / self.rate

    def set_rate(self, rate: float, now: float) -> None:
        """Change the rate without moving the head: the stream stays monotonic."""
        if rate != self.rate:
            self.base_seq = self.head(now)
            self.base_time = now
            self.rate = rate


@dataclass(eq=False)
class _Session:
    id: int
    connection: ServerConnection
    connection_id: str | None = None
    epoch: int | None = None
    worker_id: str | None = None
    after_seq: int | None = None
    last_sent_seq: int | None = None
    kicked: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class _Subscribe:
    connection_id: str
    after_seq: int
    epoch: int
    worker_id: str


class FeedServer:
    """A `seqfeed/1` server for any connection id. Use `async with FeedServer() as feed:`."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        rate: float = 20.0,
        session_log: Path | None = None,
        kick_stale: bool = False,
    ) -> None:
        if not rate >= 0 or math.isinf(rate):
            raise ValueError(f"rate must be a finite number >= 0, got {rate!r}")
        self._host = host
        self._requested_port = port
        self._rate = rate
        self._session_log_path = session_log
        self._kick_stale = kick_stale
        self._streams: dict[str, _Stream] = {}
        self._session_ids = itertools.count(1)
        self._server: Server | None = None
        self._log_fd: int | None = None
        self._port: int | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("FeedServer already started")
        if self._session_log_path is not None:
            self._session_log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_fd = os.open(self._session_log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        # No compression: frames cost what they say, and a high rate stays cheap.
        # A short close timeout bounds stop() when a client is alive but unresponsive (SIGSTOP).
        self._server = await serve(
            self._handle, self._host, self._requested_port, compression=None, close_timeout=CLOSE_TIMEOUT
        )
        self._port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Close every session with 1001 and wait until their handlers (and log lines) are done."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()
        fd, self._log_fd = self._log_fd, None
        if fd is not None:
            os.close(fd)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # -- addresses ---------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("FeedServer not started")
        return self._port

    @property
    def url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"ws://{host}:{self.port}"

    def url_for(self, connection_id: str, **query: str | int | float) -> str:
        """`ws://HOST:PORT/feeds/<id>[?query]`, e.g. `url_for("c1", rate=100, mode="gap")`."""
        url = f"{self.url}/feeds/{quote(connection_id, safe=':')}"
        return f"{url}?{urlencode(query)}" if query else url

    def highest_epoch(self, connection_id: str) -> int | None:
        """The highest epoch seen for `connection_id` (None if never subscribed)."""
        stream = self._streams.get(connection_id)
        return None if stream is None else stream.max_epoch

    # -- session log -------------------------------------------------------------------------

    def _log_event(
        self, event: str, session: _Session, *, code: int | str | None = None, reason: str | None = None
    ) -> None:
        if self._log_fd is None:
            return
        line = json.dumps(
            {
                "t_ms": time.time_ns() // 1_000_000,
                "event": event,
                "session": session.id,
                "connection_id": session.connection_id,
                "epoch": session.epoch,
                "worker_id": session.worker_id,
                "after_seq": session.after_seq,
                "last_sent_seq": session.last_sent_seq,
                "code": code,
                "reason": reason,
            },
            separators=(",", ":"),
        )
        data = (line + "\n").encode()
        # One os.write on an O_APPEND fd: the line lands whole even if several feeds share a log.
        while data:
            written = os.write(self._log_fd, data)
            data = data[written:]

    # -- one connection ----------------------------------------------------------------------

    async def _handle(self, connection: ServerConnection) -> None:
        session = _Session(id=next(self._session_ids), connection=connection)
        path = connection.request.path if connection.request is not None else "/"
        split = urlsplit(path)
        match = _FEED_PATH.fullmatch(split.path)
        path_id = unquote(match.group(1)) if match else None
        session.connection_id = path_id
        self._log_event("open", session)
        stream: _Stream | None = None
        close_code: int = CloseCode.NORMAL_CLOSURE
        close_reason = ""
        try:
            try:
                # Read the subscribe frame first, so a client always gets its answer after it.
                request = await self._read_subscribe(connection, path_id)
                session.connection_id = request.connection_id
                session.epoch = request.epoch
                session.worker_id = request.worker_id
                session.after_seq = request.after_seq
                mode, rate = _parse_query(split.query)
            except BadRequest as exc:
                self._log_event("reject", session, code=BAD_REQUEST, reason=str(exc))
                await _send_quietly(connection, error_frame(BAD_REQUEST, str(exc)))
                close_code, close_reason = CloseCode.POLICY_VIOLATION, BAD_REQUEST
                return
            now = time.monotonic()
            stream = self._streams.get(request.connection_id)
            if stream is None:
                stream = _Stream(rate=self._rate if rate is None else rate, base_time=now)
                self._streams[request.connection_id] = stream
            elif rate is not None:
                stream.set_rate(rate, now)

            if request.epoch < stream.max_epoch:
                message = f"epoch {request.epoch} < {stream.max_epoch} for {request.connection_id}"
                self._log_event("reject", session, code=STALE_EPOCH, reason=message)
                await _send_quietly(connection, error_frame(STALE_EPOCH, message))
                close_code, close_reason = CloseCode.POLICY_VIOLATION, STALE_EPOCH
                return
            if request.epoch > stream.max_epoch:
                stream.max_epoch = request.epoch
                if self._kick_stale:
                    for other in stream.sessions:
                        if other.epoch is not None and other.epoch < request.epoch:
                            other.kicked.set()
            stream.sessions.add(session)
            self._log_event("subscribe", session)
            close_code, close_reason = await self._run_session(session, stream, mode)
        except ConnectionClosed:
            pass
        finally:
            if stream is not None:
                stream.sessions.discard(session)
            # Idempotent; a no-op when the peer (or server.close) already closed.
            with contextlib.suppress(Exception):
                await connection.close(close_code, close_reason)
            self._log_event(
                "close",
                session,
                code=connection.close_code
                if connection.close_code is not None
                else CloseCode.ABNORMAL_CLOSURE,
                reason=connection.close_reason or None,
            )

    async def _read_subscribe(self, connection: ServerConnection, path_id: str | None) -> _Subscribe:
        try:
            async with asyncio.timeout(SUBSCRIBE_TIMEOUT):
                raw = await connection.recv()
        except TimeoutError:
            raise BadRequest(f"no subscribe frame within {SUBSCRIBE_TIMEOUT:g}s") from None
        try:
            message = json.loads(raw)
        except ValueError:
            raise BadRequest("subscribe frame is not JSON") from None
        if not isinstance(message, dict) or message.get("type") != "subscribe":
            raise BadRequest("first frame must be a subscribe object")
        connection_id = message.get("connection_id")
        after_seq = message.get("after_seq")
        epoch = message.get("epoch")
        worker_id = message.get("worker_id")
        if not isinstance(connection_id, str) or not _ID.fullmatch(connection_id):
            raise BadRequest("connection_id must match [A-Za-z0-9._:-]{1,128}")
        if path_id is not None and path_id != connection_id:
            raise BadRequest(f"connection_id {connection_id!r} does not match the URL path {path_id!r}")
        if not _is_int(after_seq) or after_seq < -1:
            raise BadRequest("after_seq must be an integer >= -1")
        if not _is_int(epoch) or epoch < 0:
            raise BadRequest("epoch must be an integer >= 0")
        if not isinstance(worker_id, str) or not worker_id:
            raise BadRequest("worker_id must be a non-empty string")
        return _Subscribe(connection_id, after_seq, epoch, worker_id)

    async def _run_session(
        self, session: _Session, stream: _Stream, mode: FaultMode | None
    ) -> tuple[int, str]:
        """Send until the client goes away, the server stops, a fault ends it, or it is kicked.
        Returns the close code and reason to use if the connection is still open."""
        connection = session.connection
        if mode == "close":
            return CloseCode.INTERNAL_ERROR, "fault: close"
        if mode == "error":
            await connection.send(error_frame(UNAVAILABLE, "fault: upstream unavailable"))
            return CloseCode.TRY_AGAIN_LATER, UNAVAILABLE

        sender = asyncio.create_task(self._send_loop(session, stream, mode))
        # Reading is what notices the client's close frame promptly (and drains anything the
        # client sends after subscribe, so a chatty client cannot stall the close handshake).
        reader = asyncio.create_task(_drain(connection))
        kicked = asyncio.create_task(session.kicked.wait())
        tasks = {sender, reader, kicked}
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
        sender_result = results[0]
        if isinstance(sender_result, BaseException) and not isinstance(
            sender_result, ConnectionClosed | asyncio.CancelledError
        ):
            raise sender_result
        if session.kicked.is_set():
            message = f"a higher epoch than {session.epoch} subscribed to {session.connection_id}"
            await _send_quietly(connection, error_frame(STALE_EPOCH, message))
            return CloseCode.POLICY_VIOLATION, STALE_EPOCH
        return CloseCode.NORMAL_CLOSURE, ""

    async def _send_loop(self, session: _Session, stream: _Stream, mode: FaultMode | None) -> None:
        connection = session.connection
        assert session.connection_id is not None and session.after_seq is not None
        connection_id = session.connection_id
        next_seq = session.after_seq + 1
        sent = 0
        while True:
            now = time.monotonic()
            head = stream.head(now)
            while next_seq <= head:
                if mode == "drop" and sent == 1:
                    connection.transport.abort()  # no close frame: the TCP connection just goes
                    return
                if mode in ("gap", "surrogate") and sent == FAULT_AFTER:
                    if mode == "gap":
                        next_seq += 1  # skip one seq, then carry on as if nothing happened
                    else:
                        await connection.send(_surrogate_frame(connection_id, next_seq))
                        session.last_sent_seq = next_seq
                        next_seq += 1
                    mode = None
                    continue
                if mode in ("garbage", "oversized", "deep") and sent == FAULT_AFTER:
                    if mode == "garbage":
                        await connection.send(GARBAGE_FRAME)
                    elif mode == "oversized":
                        await connection.send(_oversized_frame(connection_id, next_seq))
                    else:
                        await connection.send(_deep_frame(next_seq))
                    # Leave the broken stream open: the client must notice on its own.
                    await connection.wait_closed()
                    return
                await connection.send(data_frame(connection_id, next_seq))
                session.last_sent_seq = next_seq
                next_seq += 1
                sent += 1
                if mode == "replay" and sent % FAULT_AFTER == 0:
                    for seq in range(next_seq - FAULT_AFTER, next_seq):  # send them all again
                        await connection.send(data_frame(connection_id, seq))
                if sent % REPLAY_YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # a long replay must not starve other sessions
            delay = stream.time_of(next_seq) - time.monotonic()
            await asyncio.sleep(min(max(delay, MIN_TICK), MAX_TICK))


def _oversized_frame(connection_id: str, seq: int) -> str:
    data = data_for(connection_id, seq)
    data["pad"] = "x" * (MAX_FRAME_BYTES + 1)
    return json.dumps({"type": "data", "seq": seq, "data": data}, separators=(",", ":"))


def _deep_frame(seq: int) -> str:
    return f'{{"type":"data","seq":{seq},"data":' + "[" * DEEP_NESTING + "]" * DEEP_NESTING + "}"


def _surrogate_frame(connection_id: str, seq: int) -> str:
    data = data_for(connection_id, seq)
    body = json.dumps({"type": "data", "seq": seq, "data": data}, separators=(",", ":"))
    return body[:-2] + f',"text":"{LONE_SURROGATE}"}}}}'


async def _drain(connection: ServerConnection) -> None:
    with contextlib.suppress(ConnectionClosed):
        async for _ in connection:
            pass


async def _send_quietly(connection: ServerConnection, frame: str) -> None:
    with contextlib.suppress(ConnectionClosed):
        await connection.send(frame)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_query(query: str) -> tuple[FaultMode | None, float | None]:
    params = parse_qs(query, keep_blank_values=True)
    mode: FaultMode | None = None
    rate: float | None = None
    if "mode" in params:
        value = params["mode"][-1]
        if value not in FAULT_MODES:
            raise BadRequest(f"unknown mode {value!r}; one of {', '.join(sorted(FAULT_MODES))}")
        mode = value  # type: ignore[assignment]  # checked against FAULT_MODES just above
    if "rate" in params:
        raw = params["rate"][-1]
        try:
            rate = float(raw)
        except ValueError:
            raise BadRequest(f"rate must be a number, got {raw!r}") from None
        if not rate >= 0 or math.isinf(rate):
            raise BadRequest(f"rate must be a finite number >= 0, got {raw!r}")
    return mode, rate
