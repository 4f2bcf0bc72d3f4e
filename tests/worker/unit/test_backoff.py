"""Reconnect pacing and the fatal-vs-retryable classifier."""

from __future__ import annotations

import itertools

import pytest
from websockets.exceptions import InvalidURI

from leaseworker.worker.backoff import (
    HEALTHY_SECONDS,
    FatalUpstreamError,
    ReconnectPacing,
    backoff,
    check_upstream_url,
    is_fatal,
    is_loopback,
)


def test_backoff_doubles_then_caps_with_equal_jitter() -> None:
    low = list(itertools.islice(backoff(initial=1, factor=2, cap=8, rand=lambda: 0.0), 6))
    high = list(itertools.islice(backoff(initial=1, factor=2, cap=8, rand=lambda: 1.0), 6))
    assert low == [0.5, 1, 2, 4, 4, 4]  # never zero: half the step is fixed
    assert high == [1, 2, 4, 8, 8, 8]


def test_backoff_jitter_stays_within_bounds() -> None:
    for delay, step in zip(
        itertools.islice(backoff(initial=0.2, cap=30), 20), [0.2 * 2**i for i in range(20)], strict=True
    ):
        capped = min(step, 30)
        assert capped / 2 <= delay <= capped


def test_a_new_generator_starts_again_from_the_initial_delay() -> None:
    delays = backoff(initial=1, cap=8, rand=lambda: 1.0)
    assert [next(delays) for _ in range(4)] == [1, 2, 4, 8]
    assert next(backoff(initial=1, cap=8, rand=lambda: 1.0)) == 1  # what "reset" means


@pytest.mark.parametrize(
    ("url", "insecure_ok"),
    [
        ("wss://feed.example.com/x", False),
        ("ws://127.0.0.1:9000/x", False),
        ("ws://localhost/x", False),
        ("ws://[::1]:80/x", False),
        ("ws://feed.example.com/x", True),
    ],
)
def test_acceptable_urls(url: str, insecure_ok: bool) -> None:
    check_upstream_url(url, allow_insecure=insecure_ok)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://feed.example.com/x", "unsupported scheme"),
        ("feed.example.com/x", "unsupported scheme"),
        ("ws://feed.example.com/x", "ALLOW_INSECURE_WS"),
        ("wss:///nohost", "no host"),
        ("wss://host:notaport/x", "unparseable"),
        ("wss://[::1/x", "unparseable"),
    ],
)
def test_urls_that_can_never_work_are_fatal(url: str, why: str) -> None:
    with pytest.raises(FatalUpstreamError, match=why):
        check_upstream_url(url, allow_insecure=False)


def test_classifier() -> None:
    assert is_fatal(FatalUpstreamError("x"))
    assert is_fatal(InvalidURI("wss://", "bad"))
    assert not is_fatal(ConnectionRefusedError())
    assert not is_fatal(TimeoutError())
    assert not is_fatal(OSError("network unreachable"))


def test_loopback() -> None:
    assert is_loopback("127.0.0.2") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("10.0.0.1") and not is_loopback("example.com")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def pacing(clock: FakeClock, healthy: float = 10.0) -> ReconnectPacing:
    return ReconnectPacing(
        healthy_seconds=healthy, delays=lambda: backoff(initial=1, cap=64, rand=lambda: 1.0), clock=clock
    )


def test_short_connections_never_reset_the_backoff() -> None:
    """An upstream that sends one record and drops, forever, is reconnected to ever more slowly."""
    clock = FakeClock()
    pace = pacing(clock)
    delays = []
    for _ in range(6):
        pace.connected()
        clock.now += 0.5  # one record, then the drop
        pace.disconnected()
        delays.append(pace.next_delay())
        clock.now += delays[-1]
    assert delays == [1, 2, 4, 8, 16, 32]


def test_a_connection_healthy_for_long_enough_resets_the_backoff() -> None:
    clock = FakeClock()
    pace = pacing(clock, healthy=10.0)
    assert [pace.next_delay() for _ in range(3)] == [1, 2, 4]
    pace.connected()
    clock.now += 9.5
    pace.disconnected()
    assert pace.next_delay() == 8  # not quite long enough
    pace.connected()
    clock.now += 10.0
    pace.disconnected()
    assert pace.next_delay() == 1


def test_a_failed_connect_is_not_a_healthy_connection() -> None:
    clock = FakeClock()
    pace = pacing(clock)
    pace.next_delay()
    clock.now += 100  # time passes while nothing is connected
    pace.disconnected()
    assert pace.next_delay() == 2


def test_the_default_healthy_period_is_the_named_constant() -> None:
    clock = FakeClock()
    pace = ReconnectPacing(delays=lambda: backoff(initial=1, rand=lambda: 1.0), clock=clock)
    pace.next_delay()
    pace.connected()
    clock.now += HEALTHY_SECONDS - 0.01
    pace.disconnected()
    assert pace.next_delay() == 2
    assert HEALTHY_SECONDS >= 10.0
