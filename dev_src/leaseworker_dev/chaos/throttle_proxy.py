"""An HTTP-aware fault proxy in front of DynamoDB Local, for one worker (docs/design.md §10, issue 11).

It extends local/proxy.py's TcpProxy (pass / blackhole / reset keep their meaning) without
changing it: it reads one HTTP/1.1 request at a time, so that each request can be delayed by a
latency with jitter, or answered by the proxy itself with a real DynamoDB throttling error
(HTTP 400, `x-amzn-ErrorType`, a JSON body whose `__type` botocore maps to the error code)
instead of being forwarded. A delayed request is still sent on after its client gave up: a
late write reaches DynamoDB Local the way it would reach DynamoDB, and only its conditions
decide whether it lands.

Lost replies (issue 20): with `lose_rate` (every request) or `lose_claim_rate` (claims and
acquires: the UpdateItems that add 1 to `lease_epoch`), the request is forwarded and applied, the
reply is read from DynamoDB Local, and then it is lost: either the client's connection is reset
instead of the reply being forwarded ("drop"), or the reply is held for `lose_delay` seconds,
past the client's deadline, before it is forwarded ("delay"; a client that gave up has closed
the socket, so nobody reads it). `lose_how` picks one, or "mixed" draws one per lost reply.

Held releases (a run-wide setting, `hold_releases`): every write that removes `lease_owner` waits
before it is forwarded, so the worker's leases stay RELEASING for that long (a slow release, as
under throttling): the releasing-entry negative control needs a checkpoint round inside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import uuid
from dataclasses import dataclass
from typing import Final

from leaseworker_dev.local.proxy import ProxyThread, TcpProxy

THROTTLE_TYPES: Final = {
    "ProvisionedThroughputExceededException": "com.amazonaws.dynamodb.v20120810",
    "ThrottlingException": "com.amazon.coral.availability",
}
_HEADER_END: Final = b"\r\n\r\n"
_MAX_HEADER_BYTES: Final = 64 * 1024


class HttpFramingError(Exception):
    """The byte stream is not HTTP/1.1 as this proxy understands it."""


@dataclass
class Faults:
    """What the proxy does to each request (the TcpProxy mode applies on top)."""

    latency: float = 0.0  # seconds added before forwarding each request
    jitter: float = 0.0  # uniform +- seconds around latency
    throttle_rate: float = 0.0  # share of requests answered with a throttling error
    throttle_code: str = "ProvisionedThroughputExceededException"
    lose_rate: float = 0.0  # share of replies lost after the request was applied
    lose_claim_rate: float = 0.0  # the same, for claims/acquires (UpdateItem ... ADD lease_epoch)
    lose_how: str = "mixed"  # "drop" (reset), "delay" (past the deadline) or "mixed"
    lose_delay: float = 6.0  # seconds a delayed reply is held

    def lose_chance(self, request: bytes) -> float:
        if self.lose_claim_rate and is_claim_request(request):
            return max(self.lose_rate, self.lose_claim_rate)
        return self.lose_rate


_CLAIM = re.compile(rb'"UpdateExpression":\s*"[^"]*ADD lease_epoch')
_RELEASE = re.compile(rb'"UpdateExpression":\s*"[^"]*REMOVE lease_owner')


def is_claim_request(request: bytes) -> bool:
    """An UpdateItem that adds 1 to the epoch: a claim or an acquire (tests/worker/lost_reply.is_claim)."""
    return b"UpdateItem" in request and _CLAIM.search(request) is not None


def is_release_request(request: bytes) -> bool:
    """A write that hands a connection back (release, mark-failed, free): it removes the owner."""
    return _RELEASE.search(request) is not None


def throttle_response(code: str, message: str = "Rate of requests exceeds the allowed throughput.") -> bytes:
    body = json.dumps({"__type": f"{THROTTLE_TYPES[code]}#{code}", "message": message}).encode()
    head = (
        "HTTP/1.1 400 Bad Request\r\n"
        f"x-amzn-RequestId: {uuid.uuid4().hex.upper()}\r\n"
        f"x-amzn-ErrorType: {code}\r\n"
        "Content-Type: application/x-amz-json-1.0\r\n"
        f"Content-Length: {len(body)}\r\n"
        "\r\n"
    )
    return head.encode() + body


async def read_message(reader: asyncio.StreamReader) -> bytes | None:
    """One HTTP/1.1 message (request or response) as bytes; None at a clean EOF before it."""
    try:
        head = await reader.readuntil(_HEADER_END)
    except asyncio.IncompleteReadError as error:
        if not error.partial:
            return None
        raise HttpFramingError("connection closed inside the headers") from None
    except asyncio.LimitOverrunError:
        raise HttpFramingError("headers too long") from None
    headers = _headers(head)
    if headers.get("transfer-encoding", "").lower() == "chunked":
        return head + await _read_chunked(reader)
    length = int(headers.get("content-length", "0"))
    return head + (await reader.readexactly(length) if length else b"")


def _headers(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    pairs = (line.split(":", 1) for line in lines if ":" in line)
    return {name.strip().lower(): value.strip() for name, value in pairs}


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size_line = await reader.readuntil(b"\r\n")
        out += size_line
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        out += await reader.readexactly(size + 2)  # the chunk and its CRLF
        if size == 0:
            return bytes(out)


class FaultProxy(TcpProxy):
    """TcpProxy plus per-request latency/jitter and injected throttling errors."""

    def __init__(self, target_host: str, target_port: int, *, seed: int = 0) -> None:
        super().__init__(target_host, target_port)
        self.faults = Faults()
        self.injected = 0
        self.forwarded = 0
        self.lost = {"drop": 0, "delay": 0, "claims": 0}
        # Seconds every release is held before it is forwarded, for a whole run (not a nemesis:
        # set_faults leaves it). It stretches a release's RELEASING window past checkpoint rounds.
        self.release_hold = 0.0
        self.releases_held = 0
        self._rng = random.Random(seed)

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self.mode == "reset":
            client_writer.transport.abort()
            return
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._writers.add(client_writer)
        try:
            while (request := await read_message(client_reader)) is not None:
                mode: str = self.mode  # set_mode() may change it between requests
                if mode == "reset":
                    break
                if mode == "blackhole":
                    continue  # swallowed: the client waits until its own deadline
                await self._delay()
                if self.release_hold and is_release_request(request):
                    self.releases_held += 1
                    await asyncio.sleep(self.release_hold)
                if self._rng.random() < self.faults.throttle_rate:
                    self.injected += 1
                    client_writer.write(throttle_response(self.faults.throttle_code))
                    await client_writer.drain()
                    continue
                if upstream is None:
                    upstream = await asyncio.open_connection(*self.target)
                    self._writers.add(upstream[1])
                upstream[1].write(request)
                await upstream[1].drain()
                response = await read_message(upstream[0])
                if response is None or self.mode != "pass":
                    break
                faults = self.faults
                chance = faults.lose_chance(request)
                if chance and self._rng.random() < chance:  # applied; its reply is lost
                    how = faults.lose_how
                    if how == "mixed":
                        how = self._rng.choice(("drop", "delay"))
                    self.lost[how] += 1
                    self.lost["claims"] += is_claim_request(request)
                    if how == "drop":
                        break  # the finally aborts the client's socket: a reset, no reply
                    await asyncio.sleep(faults.lose_delay)
                self.forwarded += 1
                client_writer.write(response)
                await client_writer.drain()
        except (OSError, asyncio.IncompleteReadError, HttpFramingError, ValueError):
            pass
        finally:
            for writer in (client_writer, upstream[1] if upstream else None):
                if writer is not None:
                    self._writers.discard(writer)
                    writer.transport.abort()

    async def _delay(self) -> None:
        faults = self.faults
        if faults.latency or faults.jitter:
            await asyncio.sleep(max(0.0, faults.latency + self._rng.uniform(-faults.jitter, faults.jitter)))


class FaultProxyThread(ProxyThread):
    """FaultProxy on its own event loop, for the synchronous chaos runner."""

    def __init__(self, target_host: str, target_port: int, *, seed: int = 0) -> None:
        super().__init__(target_host, target_port)
        self.fault_proxy = FaultProxy(target_host, target_port, seed=seed)
        self.proxy = self.fault_proxy

    def set_faults(self, faults: Faults) -> None:
        self._loop.call_soon_threadsafe(setattr, self.fault_proxy, "faults", faults)

    def hold_releases(self, seconds: float) -> None:
        self._loop.call_soon_threadsafe(setattr, self.fault_proxy, "release_hold", seconds)

    def injected(self) -> int:
        with contextlib.suppress(Exception):
            return int(asyncio.run_coroutine_threadsafe(self._injected(), self._loop).result(5))
        return -1

    async def _injected(self) -> int:
        return self.fault_proxy.injected

    def lost(self) -> dict[str, int]:
        """Replies lost so far: {"drop": n, "delay": n, "claims": n of them claims}, and the
        releases held (`hold_releases`)."""
        with contextlib.suppress(Exception):
            return dict(asyncio.run_coroutine_threadsafe(self._lost(), self._loop).result(5))
        return {}

    async def _lost(self) -> dict[str, int]:
        return dict(self.fault_proxy.lost) | {"releases_held": self.fault_proxy.releases_held}
