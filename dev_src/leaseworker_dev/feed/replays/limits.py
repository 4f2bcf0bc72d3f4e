"""A replay's connect-rate limit, as real feeds enforce theirs per client address (Binance: 300
connects per 5 minutes per IP, then 429, and a 418 ban for who keeps trying).

At most `count` accepted connects in any sliding window of `seconds` (counted when the opening
handshake arrives, as an upstream counts them); a connect beyond it gets HTTP 429 with
Retry-After; after `ban_after` refusals the address is banned: 418 with Retry-After for
`ban_seconds`. `armed` lets a test switch the limit on at a chosen moment.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

from websockets.datastructures import Headers
from websockets.http11 import Response

_REASONS = {429: "Too Many Requests", 418: "I'm a teapot"}


@dataclass
class ConnectLimit:
    count: int
    seconds: float
    ban_after: int = 3  # 429s before the ban
    ban_seconds: float = 10.0
    armed: bool = True
    accepted: deque[float] = field(default_factory=deque)  # monotonic times within the window
    refused: int = 0
    banned_until: float = -math.inf

    def __post_init__(self) -> None:
        if self.count < 1 or not self.seconds > 0:
            raise ValueError(f"connect limit must be >= 1 per > 0 s, got {self.count} per {self.seconds}")

    def admit(self, now: float | None = None) -> Response | None:
        """None to accept this connect (and count it), else the refusal to answer with."""
        now = time.monotonic() if now is None else now
        if not self.armed:
            return None
        if now < self.banned_until:
            return _refusal(418, self.banned_until - now, "banned: too many connects")
        while self.accepted and self.accepted[0] <= now - self.seconds:
            self.accepted.popleft()
        if len(self.accepted) < self.count:
            self.accepted.append(now)
            return None
        self.refused += 1
        if self.refused >= self.ban_after:
            self.banned_until = now + self.ban_seconds
            return _refusal(418, self.ban_seconds, "banned: too many connects")
        return _refusal(429, self.accepted[0] + self.seconds - now, "too many connects")


def _refusal(status: int, retry_after: float, body: str) -> Response:
    headers = Headers([("Content-Type", "text/plain"), ("Retry-After", str(max(1, math.ceil(retry_after))))])
    return Response(status, _REASONS[status], headers, body.encode())


def peak_in_window(times_ms: list[int], seconds: float) -> int:
    """The most connects (their times, ms) in any window of `seconds`: what a limit must bound."""
    times = sorted(times_ms)
    window = int(seconds * 1000)
    peak, start = 0, 0
    for end, t in enumerate(times):
        while times[start] <= t - window:
            start += 1
        peak = max(peak, end - start + 1)
    return peak
