"""`python -m leaseworker_dev.feed`: run the local `seqfeed/1` upstream until SIGTERM/SIGINT.

When it is listening it prints one line, `{"feed": "ws://HOST:PORT"}`, on stdout (with the real
port when --port is 0), and it exits 0 after a signal once every session is closed and logged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from leaseworker_dev.feed.server import FAULT_MODES, FeedServer


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m leaseworker_dev.feed",
        description="Run the local seqfeed/1 upstream.",
        epilog="Fault modes, per connection URL (ws://HOST:PORT/feeds/ID?mode=M): "
        + ", ".join(sorted(FAULT_MODES))
        + ". See leaseworker_dev/feed/server.py for what each does.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    parser.add_argument("--rate", type=float, default=20.0, help="messages per second per connection id")
    parser.add_argument("--session-log", type=Path, default=None, help="append one JSON line per event")
    parser.add_argument(
        "--kick-stale",
        action="store_true",
        help="close open lower-epoch sessions when a higher epoch subscribes (off by default)",
    )
    return parser.parse_args(argv)


async def serve_until_signalled(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with FeedServer(
        host=args.host,
        port=args.port,
        rate=args.rate,
        session_log=args.session_log,
        kick_stale=args.kick_stale,
    ) as feed:
        print(json.dumps({"feed": feed.url}), flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        asyncio.run(serve_until_signalled(args))
    except (OSError, ValueError) as exc:
        print(f"leaseworker_dev.feed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
