"""Reconnect pacing: capped exponential backoff with jitter, and what is worth retrying at all."""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

from websockets.exceptions import InvalidURI

from leaseworker.clock import monotonic


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


HEALTHY_SECONDS = 10.0
"""A connection that stayed up this long was healthy: only then does the backoff start again.
One record is not enough: an upstream that sends one record and drops would otherwise be
reconnected to at the initial delay forever (docs/design.md §3)."""


class ReconnectPacing:
    """The backoff of one session across its connection attempts."""

    def __init__(
        self,
        *,
        healthy_seconds: float | None = None,
        delays: Callable[[], Iterator[float]] = backoff,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        self._healthy_seconds = HEALTHY_SECONDS if healthy_seconds is None else healthy_seconds
        self._new_delays = delays
        self._delays = delays()
        self._clock = clock
        self._connected_at: float | None = None

    def connected(self) -> None:
        self._connected_at = self._clock()

    def disconnected(self) -> None:
        """The connection ended: if it had stayed up for `healthy_seconds`, reset the backoff."""
        if self._connected_at is not None and self._clock() - self._connected_at >= self._healthy_seconds:
            self._delays = self._new_delays()
        self._connected_at = None

    def next_delay(self) -> float:
        return next(self._delays)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_upstream_url(url: str, *, allow_insecure: bool) -> None:
    """Raise FatalUpstreamError if `url` can never be connected to under docs/design.md §4.1."""
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
