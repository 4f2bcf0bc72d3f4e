"""The private aiohttp and aiobotocore surface that leaseworker.no_linger relies on is still there.

aiohttp has no public way to choose the protocol a connector builds, so no_linger.py replaces
`TCPConnector._factory` to make every close an abort (docs/design.md §2d), and reads
`ResponseHandler._connection_lost_called` and `.closed`. aiobotocore's `_create_connector` is
where it gets the connector. None of these is a supported interface, so the versions are pinned
exactly and this module fails when an upgrade changes any of them: a bump of the pins in
worker_src/requirements.txt must pass here first. (tests/worker/integration/test_late_write.py shows what
each half prevents on live sockets.)
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
from collections.abc import AsyncIterator
from importlib.metadata import version
from pathlib import Path

import aiohttp
import pytest
from aiobotocore.httpsession import AIOHTTPSession
from aiohttp import web
from aiohttp.client_proto import ResponseHandler

from leaseworker.no_linger import AbortOnCloseHandler, NoLingerAIOHTTPSession, no_linger_socket

REQUIREMENTS = Path(__file__).resolve().parents[3] / "worker_src" / "requirements.txt"


def pinned(distribution: str) -> str:
    """The exact version requirements.txt pins for `distribution`; fails if it is not `==`."""
    for line in REQUIREMENTS.read_text().splitlines():
        name, _, rest = line.partition("==")
        if name.strip().lower().replace("_", "-") == distribution and rest:
            assert re.fullmatch(r"[0-9][0-9A-Za-z.]*", rest.strip()), line
            return rest.strip()
    raise AssertionError(f"{distribution} is not pinned with == in {REQUIREMENTS}")


@pytest.mark.parametrize("distribution", ["aiohttp", "aiobotocore"])
def test_the_versions_no_linger_was_checked_against_are_pinned_and_installed(distribution: str) -> None:
    assert version(distribution) == pinned(distribution)


async def test_a_connector_builds_its_protocols_with_a_partial_named_factory() -> None:
    connector = aiohttp.TCPConnector()
    try:
        factory = getattr(connector, "_factory", None)
        assert isinstance(factory, functools.partial), factory
        assert factory.func is ResponseHandler
        assert set(factory.keywords) == {"loop"}
    finally:
        await connector.close()


def test_response_handler_has_the_attributes_the_abort_reads() -> None:
    loop = asyncio.new_event_loop()
    try:
        handler = AbortOnCloseHandler(loop)
        assert handler._connection_lost_called is False
        assert isinstance(handler, ResponseHandler)
        assert hasattr(handler, "closed") and hasattr(handler, "abort") and hasattr(handler, "transport")
    finally:
        loop.close()


def test_aiobotocore_session_still_creates_its_connector_in_create_connector() -> None:
    create = getattr(AIOHTTPSession, "_create_connector", None)
    assert callable(create)
    assert list(inspect.signature(create).parameters) == ["self", "proxy_url"]
    init = inspect.signature(AIOHTTPSession.__init__).parameters
    assert "connector_args" in init


@pytest.fixture
async def http_server() -> AsyncIterator[str]:
    async def hello(request: web.Request) -> web.StreamResponse:
        # Chunked and unfinished at first: the client's connection stays held while the test looks.
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"o")
        await asyncio.sleep(0.2)
        await response.write(b"k")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        await runner.cleanup()


async def test_aiohttp_builds_each_connection_with_the_replaced_factory(http_server: str) -> None:
    """The replacement takes effect: a request's connection speaks AbortOnCloseHandler."""
    connector = aiohttp.TCPConnector(socket_factory=no_linger_socket)
    factory = functools.partial(AbortOnCloseHandler, loop=asyncio.get_running_loop())
    setattr(connector, "_factory", factory)  # noqa: B010 - as no_linger does: private
    async with aiohttp.ClientSession(connector=connector) as session, session.get(http_server) as response:
        assert response.connection is not None  # held until the body is read
        assert type(response.connection.protocol) is AbortOnCloseHandler
        assert await response.text() == "ok"


async def test_the_session_class_wires_both_halves() -> None:
    """NoLingerAIOHTTPSession's connector has the aborting factory and the SO_LINGER socket factory."""
    session = NoLingerAIOHTTPSession(connector_args=None)
    connector = getattr(session, "_create_connector")(None)  # noqa: B009 - private, like no_linger's call
    try:
        factory = getattr(connector, "_factory")  # noqa: B009
        assert isinstance(factory, functools.partial)
        assert isinstance(factory(), AbortOnCloseHandler)
        assert getattr(connector, "_socket_factory", None) is no_linger_socket
    finally:
        await connector.close()
