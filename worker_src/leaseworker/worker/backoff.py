"""Reconnect pacing: capped exponential backoff with jitter, and what is worth retrying at all."""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

from websockets.exceptions import InvalidURI


class FatalUpstreamError(Exception):
    """The connection can never work as configured (bad scheme, unparseable URL...)."""


def backoff(
    *,
    initial: float = 0.2,
    factor: float = 2.0,
    cap: float = 30.0,
    rand: Callable[[], float] = random.random,
) -> Iterator[float]:
    """Delays with "equal jitter": each is between half and all of the capped exponential step,
    so peers reconnecting to one upstream spread out but never hammer it with zero delays."""
    step = initial
    while True:
        capped = min(step, cap)
        yield capped / 2 + rand() * capped / 2
        step *= factor


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_upstream_url(url: str, *, allow_insecure: bool) -> None:
    """Raise FatalUpstreamError if `url` can never be connected to under DESIGN.md §4.1."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        _ = parts.port  # raises ValueError on a malformed port
    except ValueError as error:
        raise FatalUpstreamError(f"unparseable url {url!r}: {error}") from None
    if parts.scheme not in ("ws", "wss"):
        raise FatalUpstreamError(f"unsupported scheme {parts.scheme!r} in {url!r}: use wss://")
    if not host:
        raise FatalUpstreamError(f"no host in {url!r}")
    if parts.scheme == "ws" and not allow_insecure and not is_loopback(host):
        raise FatalUpstreamError(
            f"ws:// to non-loopback host {host!r} needs ALLOW_INSECURE_WS=true: use wss://"
        )


def is_fatal(error: BaseException) -> bool:
    """The classifier: only configuration errors are fatal; network and upstream errors retry."""
    return isinstance(error, FatalUpstreamError | InvalidURI)
