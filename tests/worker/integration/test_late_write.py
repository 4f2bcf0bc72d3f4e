"""No write lands after the lease has moved (docs/design.md §2d; issue 8 group 3, issue 10 point 2).

A TCP proxy in front of moto's Kinesis stalls the connection of writer A (epoch 1), the way a
congested path does: A's PutRecords bytes wait in the kernel's buffers and in asyncio's. A's
sink gives up at its deadline. Writer B (epoch 2, the new owner after a takeover) then writes
the same connection directly. Then the proxy lets the stalled bytes flow. Reading the stream in
shard order, the epoch of that connection must never decrease (S1 at one arbiter).

The same scenario runs with the protection switched off, and the oracle must then see the late
write. What each half prevents is shown at the socket, against a server that stops reading:
- without SO_LINGER 0, the kernel still sends what it had queued after the socket is closed;
- without the abort, asyncio still sends what it had buffered, and only then closes.
(Through the proxy, SO_LINGER 0 alone also stops the large write: its small receive window
keeps the tail of the request in the sender's kernel until the close, which discards it. But
the request is still alive when the sink has given up, as the socket test shows.)

Last, the writer's process is SIGKILLed with its request stalled (issue 10): with SO_LINGER 0
the kernel resets the connection at the death; without it, it delivers the dead writer's
request after the new owner's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import aioboto3
import pytest
from aiobotocore.config import AioConfig
from types_aiobotocore_kinesis import KinesisClient

from leaseworker.aws import LEASE_CLIENT_CONFIG
from leaseworker.no_linger import NoLingerAIOHTTPSession, send_deadline
from leaseworker.records import SinkRecord
from leaseworker.sinks import SinkError
from leaseworker.sinks.factory import KINESIS_MAX_POOL_CONNECTIONS, kinesis_client_config
from leaseworker.sinks.kinesis import KinesisSink
from leaseworker_dev.local.invariants import Delivered, Report, check_s1_arrival
from leaseworker_dev.local.proxy import TcpProxy
from leaseworker_dev.local.stream import read_arrivals

REGION = "us-east-1"
REPO_ROOT = Path(__file__).resolve().parents[3]
CONNECTION = "late-conn"
# Fits in the kernel's buffers (about 3 MB on loopback with a stalled receiver, measured), so
# nothing stays in asyncio's buffer: only SO_LINGER decides whether it is sent after close().
SMALL_RECORDS = (20, 1_000)
# Over the kernel's buffers (5 records of 900 KB: a 6 MB request after base64): asyncio holds
# the rest, so a graceful close sends it whenever the path recovers; the abort drops it.
LARGE_RECORDS = (5, 900_000)
STALLED_DEADLINE_SECONDS = 1.0
PROXY_RECEIVE_BUFFER = 4096


class LingeringSession(NoLingerAIOHTTPSession):
    linger_zero = False
    abort_on_close = False


class AbortOnlySession(NoLingerAIOHTTPSession):
    linger_zero = False


class LingerOnlySession(NoLingerAIOHTTPSession):
    abort_on_close = False


@dataclass(frozen=True)
class Outcome:
    arrivals: list[Delivered]
    report: Report

    def epochs(self) -> list[int]:
        return [item.epoch for item in self.arrivals]


def batch(epoch: int, worker: str, count: int, size: int) -> list[SinkRecord]:
    return [
        SinkRecord(CONNECTION, seq, epoch, worker, 1_700_000_000_000 + seq, "d" * size)
        for seq in range(count)
    ]


@pytest.fixture
async def direct_kinesis(moto_endpoint: str) -> AsyncIterator[KinesisClient]:
    session = aioboto3.Session()
    async with session.client(
        "kinesis", endpoint_url=moto_endpoint, region_name=REGION, config=kinesis_client_config()
    ) as client:
        yield client


async def new_stream(client: KinesisClient, name: str) -> str:
    await client.create_stream(StreamName=name, ShardCount=1)
    waiter = client.get_waiter("stream_exists")
    await waiter.wait(StreamName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 20})
    return name


async def late_write_scenario(
    moto_endpoint: str,
    direct: KinesisClient,
    stream: str,
    session_cls: type[NoLingerAIOHTTPSession],
    shape: tuple[int, int],
) -> Outcome:
    target = urlsplit(moto_endpoint)
    assert target.hostname is not None and target.port is not None
    proxy = TcpProxy(target.hostname, target.port, receive_buffer_bytes=PROXY_RECEIVE_BUFFER)
    await proxy.start()
    # Writer A: the production config (no SDK retry), except for the session class under test,
    # and a read timeout past the sink's deadline, so that it is the sink that abandons the call.
    config = AioConfig(
        connect_timeout=2,
        read_timeout=30,
        retries={"max_attempts": 1, "mode": "standard"},
        http_session_cls=session_cls,
    )
    try:
        async with aioboto3.Session().client(
            "kinesis", endpoint_url=proxy.url, region_name=REGION, config=config
        ) as stalled_client:
            proxy.stall_next_connection()
            writer_a = KinesisSink(stalled_client, stream, deadline_seconds=STALLED_DEADLINE_SECONDS)
            with pytest.raises(SinkError, match="not accepted within") as raised:
                await writer_a.write(batch(1, "worker-a", *shape))
            assert raised.value.accepted == 0
            assert proxy.stalled_accepted.is_set()

            # The lease moved: the new owner replays from the checkpoint (none) under epoch 2.
            writer_b = KinesisSink(direct, stream)
            await writer_b.write(batch(2, "worker-b", *shape))

            proxy.release_stalled()
            # Whatever the stalled path still carries reaches moto before the proxy's connection
            # ends (a complete request is answered first); give it that long.
            await asyncio.wait_for(proxy.stalled_finished.wait(), timeout=30)
    finally:
        await proxy.stop()
    arrivals = await read_arrivals(moto_endpoint, stream)
    report = Report()
    check_s1_arrival(arrivals, report)
    return Outcome(arrivals, report)


@pytest.mark.parametrize("shape", [SMALL_RECORDS, LARGE_RECORDS], ids=["small", "large"])
async def test_an_abandoned_write_never_lands_after_the_new_owner(
    moto_endpoint: str, direct_kinesis: KinesisClient, shape: tuple[int, int]
) -> None:
    stream = await new_stream(direct_kinesis, f"late-{shape[0]}")
    outcome = await late_write_scenario(moto_endpoint, direct_kinesis, stream, NoLingerAIOHTTPSession, shape)
    assert outcome.report.ok, outcome.report.violations
    assert outcome.epochs() == [2] * shape[0]  # writer A's request never completed


@pytest.mark.parametrize(
    ("session_cls", "shape"),
    [
        pytest.param(LingeringSession, SMALL_RECORDS, id="neither-small"),
        pytest.param(LingeringSession, LARGE_RECORDS, id="neither-large"),
        pytest.param(AbortOnlySession, SMALL_RECORDS, id="abort-without-linger0-small"),
    ],
)
async def test_without_the_protection_the_late_write_lands_and_s1_sees_it(
    moto_endpoint: str,
    direct_kinesis: KinesisClient,
    session_cls: type[NoLingerAIOHTTPSession],
    shape: tuple[int, int],
) -> None:
    stream = await new_stream(direct_kinesis, f"late-{session_cls.__name__.lower()}-{shape[0]}")
    outcome = await late_write_scenario(moto_endpoint, direct_kinesis, stream, session_cls, shape)
    assert outcome.epochs() == [2] * shape[0] + [1] * shape[0]  # A's whole request, after B's
    assert not outcome.report.ok
    assert outcome.report.violations[0].startswith(f"S1 {CONNECTION}: epoch 1")


# -- what leaves the socket after the sink gave up -----------------------------------------------


@dataclass(frozen=True)
class Received:
    data: bytes
    end: str  # "reset", "eof" or "open" (quiet for a second, connection still up)

    def complete_request(self) -> bool:
        head, separator, body = self.data.partition(b"\r\n\r\n")
        assert separator, "the request's headers never arrived"
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return len(body) >= length


def drain(connection: socket.socket) -> Received:
    """Read until the peer resets or closes, or is quiet for a second."""
    connection.settimeout(1.0)
    chunks: list[bytes] = []
    while True:
        try:
            chunk = connection.recv(1 << 20)
        except ConnectionResetError:
            return Received(b"".join(chunks), "reset")
        except TimeoutError:
            return Received(b"".join(chunks), "open")
        if not chunk:
            return Received(b"".join(chunks), "eof")
        chunks.append(chunk)


@dataclass(frozen=True)
class Abandoned:
    still_open: int  # this process's sockets to the server right after write() raised
    received: Received  # what the server got once it read again


async def abandon_against_a_stalled_server(
    session_cls: type[NoLingerAIOHTTPSession], shape: tuple[int, int]
) -> Abandoned:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, PROXY_RECEIVE_BUFFER)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    config = AioConfig(
        connect_timeout=2, read_timeout=30, retries={"max_attempts": 1}, http_session_cls=session_cls
    )
    loop = asyncio.get_running_loop()
    try:
        async with aioboto3.Session().client(
            "kinesis", endpoint_url=f"http://127.0.0.1:{port}", region_name=REGION, config=config
        ) as client:
            sink = KinesisSink(client, "stalled", deadline_seconds=STALLED_DEADLINE_SECONDS)
            write = asyncio.ensure_future(sink.write(batch(1, "worker-a", *shape)))
            connection, _ = await loop.sock_accept(listener)  # then read nothing: a stalled path
            with connection:
                with pytest.raises(SinkError, match="not accepted within"):
                    await write
                still_open = len(sockets_connected_to(port))
                # The lease has moved on; now the path recovers and the server reads again.
                return Abandoned(still_open, await asyncio.to_thread(drain, connection))
    finally:
        listener.close()


@pytest.mark.parametrize(
    ("session_cls", "shape", "still_open", "end", "complete"),
    [
        # Both: by the time write() raises the socket is gone (reset): the request is dead.
        pytest.param(NoLingerAIOHTTPSession, LARGE_RECORDS, 0, "reset", False, id="both-large"),
        pytest.param(NoLingerAIOHTTPSession, SMALL_RECORDS, 0, "reset", False, id="both-small"),
        # The abort without SO_LINGER 0: the socket is closed, but the kernel still sends its
        # queue afterwards: a request that fits in it arrives whole, after the sink gave up.
        pytest.param(AbortOnlySession, SMALL_RECORDS, 0, "eof", True, id="abort-only-small"),
        pytest.param(AbortOnlySession, LARGE_RECORDS, 0, "eof", False, id="abort-only-large"),
        # SO_LINGER 0 without the abort: the abandoned request is still alive when write()
        # raises; asyncio keeps sending it whenever the path lets it (here the reset that ends
        # the graceful close still catches the tail in the kernel's queue).
        pytest.param(LingerOnlySession, LARGE_RECORDS, 1, "reset", False, id="linger0-only-large"),
        pytest.param(LingeringSession, SMALL_RECORDS, 0, "eof", True, id="neither-small"),
        pytest.param(LingeringSession, LARGE_RECORDS, 1, "eof", True, id="neither-large"),
    ],
)
async def test_what_an_abandoned_request_still_sends(
    session_cls: type[NoLingerAIOHTTPSession],
    shape: tuple[int, int],
    still_open: int,
    end: str,
    complete: bool,
) -> None:
    abandoned = await abandon_against_a_stalled_server(session_cls, shape)
    received = abandoned.received
    assert (abandoned.still_open, received.end, received.complete_request()) == (still_open, end, complete)


def sockets_connected_to(port: int) -> list[tuple[int, int]]:
    """(fd, SO_LINGER l_onoff) of this process's TCP sockets whose peer is 127.0.0.1:port."""
    found: list[tuple[int, int]] = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        with contextlib.suppress(OSError):
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            probe = socket.socket(fileno=os.dup(fd))
            with probe:
                if probe.type != socket.SOCK_STREAM or probe.getpeername()[:2] != ("127.0.0.1", port):
                    continue
                onoff, _ = struct.unpack("ii", probe.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, 8))
                found.append((fd, onoff))
    return found


# -- the production clients' sockets ---------------------------------------------------------------


async def test_kinesis_and_lease_client_sockets_carry_linger_zero(
    moto_endpoint: str, dynamodb_endpoint: str, direct_kinesis: KinesisClient
) -> None:
    await direct_kinesis.list_streams()  # opens a pooled connection, kept alive
    moto_port = urlsplit(moto_endpoint).port
    assert moto_port is not None
    kinesis_sockets = sockets_connected_to(moto_port)
    assert kinesis_sockets and all(onoff == 1 for _, onoff in kinesis_sockets), kinesis_sockets

    ddb_port = urlsplit(dynamodb_endpoint).port
    assert ddb_port is not None
    async with aioboto3.Session().client(
        "dynamodb", endpoint_url=dynamodb_endpoint, region_name=REGION, config=LEASE_CLIENT_CONFIG
    ) as ddb:
        await ddb.list_tables()
        lease_sockets = sockets_connected_to(ddb_port)
        assert lease_sockets and all(onoff == 1 for _, onoff in lease_sockets), lease_sockets
    # and a client without the session class does not (the check can tell them apart)
    async with aioboto3.Session().client(
        "dynamodb", endpoint_url=dynamodb_endpoint, region_name=REGION
    ) as plain:
        await plain.list_tables()
        assert [onoff for _, onoff in sockets_connected_to(ddb_port)] == [0]


async def test_the_kinesis_client_has_no_sdk_retry_and_a_sized_pool() -> None:
    # What botocore resolves, not the dict we pass: its `max_attempts` counts retries, so
    # {"max_attempts": 1} resolved to two attempts (review 2026-12-05, G).
    session = aioboto3.Session()
    async with session.client(
        "kinesis", region_name=REGION, endpoint_url="http://127.0.0.1:9", config=kinesis_client_config()
    ) as kinesis:
        assert vars(kinesis.meta.config)["retries"]["total_max_attempts"] == 1
    async with session.client(
        "dynamodb", region_name=REGION, endpoint_url="http://127.0.0.1:9", config=LEASE_CLIENT_CONFIG
    ) as ddb:
        assert vars(ddb.meta.config)["retries"]["total_max_attempts"] == 2  # one retry in the deadline
    config = vars(kinesis_client_config())  # botocore's Config sets its options as attributes
    assert config["max_pool_connections"] == KINESIS_MAX_POOL_CONNECTIONS
    assert config["http_session_cls"] is NoLingerAIOHTTPSession
    assert vars(LEASE_CLIENT_CONFIG)["http_session_cls"] is NoLingerAIOHTTPSession


async def test_a_write_its_caller_cancels_leaves_no_socket_behind() -> None:
    # The session cancels a write at the lease's deadline (worker/session.py), not the sink.
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, PROXY_RECEIVE_BUFFER)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    loop = asyncio.get_running_loop()
    config = AioConfig(read_timeout=30, retries={"max_attempts": 1}, http_session_cls=NoLingerAIOHTTPSession)
    try:
        async with aioboto3.Session().client(
            "kinesis", endpoint_url=f"http://127.0.0.1:{port}", region_name=REGION, config=config
        ) as client:
            sink = KinesisSink(client, "stalled", deadline_seconds=60)
            accepted = asyncio.ensure_future(loop.sock_accept(listener))
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(STALLED_DEADLINE_SECONDS):
                    await sink.write(batch(1, "worker-a", *LARGE_RECORDS))
            connection, _ = await accepted
            with connection:
                assert sockets_connected_to(port) == []  # closed before write() gave control back
                assert (await asyncio.to_thread(drain, connection)).end == "reset"
    finally:
        listener.close()


# -- the writer's process dies with its request stalled (issue 10, point 2) -------------------------

SESSIONS: dict[str, type[NoLingerAIOHTTPSession]] = {
    "protected": NoLingerAIOHTTPSession,
    "lingering": LingeringSession,
}


async def child_writer(endpoint_url: str, stream: str, session_name: str) -> None:
    """The dying worker: writes one batch under epoch 1 through the stalled path, forever."""
    config = AioConfig(read_timeout=300, retries={"max_attempts": 1}, http_session_cls=SESSIONS[session_name])
    async with aioboto3.Session().client(
        "kinesis", endpoint_url=endpoint_url, region_name=REGION, config=config
    ) as client:
        await KinesisSink(client, stream, deadline_seconds=300).write(batch(1, "dead-worker", *SMALL_RECORDS))


@pytest.mark.parametrize(("session_name", "lands"), [("protected", False), ("lingering", True)])
async def test_nothing_a_killed_writer_had_queued_lands_after_its_death(
    moto_endpoint: str, direct_kinesis: KinesisClient, session_name: str, lands: bool
) -> None:
    stream = await new_stream(direct_kinesis, f"death-{session_name}")
    target = urlsplit(moto_endpoint)
    assert target.hostname is not None and target.port is not None
    proxy = TcpProxy(target.hostname, target.port, receive_buffer_bytes=PROXY_RECEIVE_BUFFER)
    await proxy.start()
    proxy.stall_next_connection()
    code = (
        "import asyncio, sys; from tests.worker.integration.test_late_write import child_writer; "
        "asyncio.run(child_writer(*sys.argv[1:]))"
    )
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, proxy.url, stream, session_name, cwd=REPO_ROOT
    )
    try:
        await asyncio.wait_for(proxy.stalled_accepted.wait(), timeout=30)
        await asyncio.sleep(0.5)  # the child hands its request to the kernel within milliseconds
        child.kill()  # SIGKILL: no Python code of the child runs any more
        assert await child.wait() == -signal.SIGKILL
        # The takeover (the supervisor's fence and a peer's claim): epoch 2 delivers.
        await KinesisSink(direct_kinesis, stream).write(batch(2, "new-owner", *SMALL_RECORDS))
        proxy.release_stalled()
        await asyncio.wait_for(proxy.stalled_finished.wait(), timeout=30)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
        await proxy.stop()
    arrivals = await read_arrivals(moto_endpoint, stream)
    report = Report()
    check_s1_arrival(arrivals, report)
    count = SMALL_RECORDS[0]
    if lands:  # without SO_LINGER 0 the dead process's kernel queue is still delivered
        assert [d.epoch for d in arrivals] == [2] * count + [1] * count
        assert not report.ok
    else:
        assert [d.epoch for d in arrivals] == [2] * count
        assert report.ok, report.violations


# -- a write that starts after its deadline (the process stopped between check and send) ----------


async def test_nothing_is_written_past_the_send_deadline(
    direct_kinesis: KinesisClient, moto_endpoint: str
) -> None:
    """A delivery checks its lease, then the process stops before its request is written: on
    waking, asyncio would run the write before the timer that cancels it. The send deadline is
    checked at the socket write itself, so such a request is dropped, never sent late."""
    client = direct_kinesis
    await client.create_stream(StreamName="send-deadline", ShardCount=1)
    await client.get_waiter("stream_exists").wait(
        StreamName="send-deadline", WaiterConfig={"Delay": 1, "MaxAttempts": 20}
    )
    sink = KinesisSink(client, "send-deadline", deadline_seconds=3)

    def one(seq: int) -> list[SinkRecord]:
        return [SinkRecord(CONNECTION, seq, 1, "worker-a", 1_700_000_000_000 + seq, "d")]

    with send_deadline(time.monotonic() + 30):
        await sink.write(one(1))  # in time: sent (and the connection pooled)
    with send_deadline(time.monotonic() - 0.001), pytest.raises((SinkError, OSError)):
        await sink.write(one(2))  # past it: the pooled connection sends nothing
    await sink.write(one(3))  # no deadline: the client still works
    arrivals = await read_arrivals(moto_endpoint, "send-deadline")
    assert [record.seq for record in arrivals] == [1, 3]
