"""Reconnect pacing and the fatal-vs-retryable classifier."""

from __future__ import annotations

import itertools

import pytest
from websockets.exceptions import InvalidURI

from leaseworker.worker.backoff import FatalUpstreamError, backoff, check_upstream_url, is_fatal, is_loopback


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
