"""Local replays of real feeds in the local fleet, and the `generic/1` connections that read them.

`leaseworker local up` runs, besides the seqfeed/1 feed, one replay per real feed it shows
(leaseworker_dev.feed.replays: a Jetstream that can replay from a cursor, a Coinbase Exchange that
cannot), each a child process on a free port of 127.0.0.1, started and stopped with the fleet.

A real feed does not tell anyone which connection, epoch or worker subscribed. To time a takeover
the way the seqfeed/1 feed's session log does (signal → new subscription seen by the upstream),
the demo's connections carry three extra query parameters in their URL template
(`lw_connection={{connection_id}}&lw_epoch={{epoch}}&lw_worker={{worker_id}}`, rendered by the
worker at connect time; the replays ignore unknown query parameters). This module's runner
(`python -m leaseworker_dev.local.replays FEED --session-log PATH`) writes each opened socket as a
`subscribe` line in the seqfeed/1 feed's session-log format, so one reader follows every feed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

from leaseworker_dev.local.services import ManagedProcess, ServiceError, spawn

GENERIC: Final = "generic/1"
TAG_QUERY: Final = "lw_connection={{connection_id}}&lw_epoch={{epoch}}&lw_worker={{worker_id}}"
LOG_EVERY_S: Final = 0.05


@dataclass(frozen=True)
class DemoFeed:
    """One generic/1 connection of the demo: a preset against a local replay."""

    connection_id: str
    feed: str  # the replay's feed name (leaseworker_dev.feed.replays)
    preset: str
    params: tuple[tuple[str, str], ...]  # besides url
    resumable: bool  # the feed can replay from a cursor (docs/design.md §4.3)
    rate: float  # data messages per second per key


# The mixed fleet's real-feed connections: one that can replay, one that cannot.
DEMO_FEEDS: Final = (
    DemoFeed(
        "jetstream-1",
        "jetstream",
        "jetstream",
        (("collections", "app.bsky.feed.post,app.bsky.feed.like,app.bsky.graph.follow"),),
        resumable=True,
        rate=10.0,
    ),
    DemoFeed(
        "coinbase-1",
        "coinbase-exchange",
        "coinbase-exchange",
        (("product_ids", "BTC-USD,ETH-USD"),),
        resumable=False,
        rate=5.0,
    ),
)


def tagged_url(url: str) -> str:
    """`url` (a generic/1 URL template) with the demo's subscription tags as its first query pairs."""
    base, sep, query = url.partition("?")
    if not urlsplit(base).path:
        base += "/"
    return f"{base}?{TAG_QUERY}" + (f"&{query}" if sep and query else "")


def demo_config(feed: DemoFeed, replay_url: str) -> dict[str, Any]:
    """The preset's generic/1 config pointed at the local replay, its URL tagged."""
    from leaseworker.protocol import presets
    from leaseworker.protocol.generic.config import parse_config

    config = presets.expand(feed.preset, {"url": replay_url, **dict(feed.params)})
    config["connect"]["url"] = tagged_url(str(config["connect"]["url"]))
    parse_config(config)  # what the worker checks at session start, checked here first
    return config


def compact(config: dict[str, Any]) -> str:
    return json.dumps(config, separators=(",", ":"), ensure_ascii=False)


def protocol_label(item: dict[str, Any]) -> str:
    """`seqfeed/1`, or `generic/1 [preset]`, as `connections list` shows it."""
    protocol = str(item.get("protocol") or "seqfeed/1")
    preset = item.get("preset")
    return f"{protocol} [{preset}]" if preset else protocol


# ---------------------------------------------------------------------------- the child process


def start_replay(
    feed: DemoFeed, *, logs: Path, session_log: Path, timeout: float = 15.0
) -> tuple[ManagedProcess, str]:
    """Start `feed`'s replay as a child process on a free loopback port; (process, its ws URL)."""
    argv = [
        sys.executable,
        "-m",
        "leaseworker_dev.local.replays",
        feed.feed,
        "--rate",
        str(feed.rate),
        "--session-log",
        str(session_log),
    ]
    out = logs / f"replay-{feed.feed}.out"
    process = spawn(f"replay {feed.feed}", argv, port=0, log_path=out)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.alive():
            raise ServiceError(f"the {feed.feed} replay exited; see {out}")
        for line in out.read_text().splitlines():
            if line.startswith('{"feed"'):
                url = str(json.loads(line)["url"])
                process.port = int(urlsplit(url).port or 0)
                return process, url
        time.sleep(0.05)
    process.stop()
    raise ServiceError(f"the {feed.feed} replay did not start within {timeout:.0f} s")


def subscription(path: str, t_ms: int, feed: str) -> dict[str, Any] | None:
    """A session-log `subscribe` line for an opened socket whose request carried the tags."""
    query = parse_qs(urlsplit(path).query)
    try:
        connection_id = query["lw_connection"][-1]
        epoch = int(query["lw_epoch"][-1])
    except (KeyError, ValueError):
        return None
    return {
        "t_ms": t_ms,
        "event": "subscribe",
        "connection_id": connection_id,
        "epoch": epoch,
        "worker_id": query.get("lw_worker", [""])[-1],
        "feed": feed,
    }


async def serve(feed: str, rate: float, session_log: Path) -> None:
    from leaseworker_dev.feed.replays import ReplayServer

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    fd = os.open(session_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        async with ReplayServer(feed=feed, port=0, rate=rate) as server:
            print(json.dumps({"feed": feed, "url": server.url}), flush=True)
            while not stop.is_set():
                entries, server.ledger.entries[:] = list(server.ledger.entries), []  # bounded memory
                for entry in entries:
                    if entry.kind == "open":
                        line = subscription(str(entry.message), entry.t_ms, feed)
                        if line is not None:
                            os.write(fd, (json.dumps(line) + "\n").encode())
                    elif entry.kind in ("close", "refused"):
                        close = {"t_ms": entry.t_ms, "event": entry.kind, "feed": feed, "code": entry.code}
                        os.write(fd, (json.dumps(close) + "\n").encode())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), LOG_EVERY_S)
    finally:
        os.close(fd)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m leaseworker_dev.local.replays", description=__doc__)
    parser.add_argument("feed")
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--session-log", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        asyncio.run(serve(args.feed, args.rate, args.session_log))
    except (OSError, ValueError) as exc:
        print(f"leaseworker_dev.local.replays: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
