"""`python -m leaseworker_dev.feed.replays FEED --port N [--rate R]`: run one feed's local replay
until SIGTERM/SIGINT. When listening it prints one line, `{"feed": NAME, "url": "ws://…"}`."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Sequence

from leaseworker_dev.feed.replays import FEEDS, ReplayServer, load_feeds
from leaseworker_dev.feed.replays.limits import ConnectLimit


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    load_feeds()
    parser = argparse.ArgumentParser(prog="python -m leaseworker_dev.feed.replays", description=__doc__)
    parser.add_argument("feed", choices=sorted(FEEDS))
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    parser.add_argument("--rate", type=float, default=20.0, help="data messages per second per key")
    parser.add_argument("--max-age", type=float, default=None, help="close every connection after S seconds")
    parser.add_argument(
        "--connect-limit",
        metavar="COUNT/SECONDS",
        default=None,
        help="accept at most COUNT connects in any SECONDS, then 429 and, after 3 refusals, a 418 ban",
    )
    return parser.parse_args(argv)


def connect_limit(text: str | None) -> ConnectLimit | None:
    if text is None:
        return None
    count, _, seconds = text.partition("/")
    try:
        return ConnectLimit(int(count), float(seconds))
    except ValueError:
        raise ValueError(f"--connect-limit must be COUNT/SECONDS (e.g. 40/5), got {text!r}") from None


async def serve_until_signalled(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    limit = connect_limit(args.connect_limit)
    async with ReplayServer(
        feed=args.feed, port=args.port, rate=args.rate, max_age_s=args.max_age, host_limit=limit
    ) as server:
        print(json.dumps({"feed": args.feed, "url": server.url}), flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        asyncio.run(serve_until_signalled(args))
    except (OSError, ValueError) as exc:
        print(f"leaseworker_dev.feed.replays: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
