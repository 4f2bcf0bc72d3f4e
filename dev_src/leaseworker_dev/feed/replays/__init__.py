"""Local replays of real feeds, each built from the feed's public documentation (its module
cites the pages): `jetstream`, `coinbase-exchange`, `binance-spot`, `kraken-v2`, `alpaca`,
`home-assistant`. Test tooling: the worker never imports it.

    async with ReplayServer(feed="kraken-v2", port=0, rate=50) as server:
        ... connect to server.url ...; server.drop(); server.skip(3); server.ledger

`python -m leaseworker_dev.feed.replays FEED --port N [--rate R]` runs one until a signal.
"""

from __future__ import annotations

from leaseworker_dev.feed.replays.base import FEEDS, Entry, Ledger, ReplayServer


def load_feeds() -> None:
    """Import every feed module, which registers it in FEEDS."""
    from leaseworker_dev.feed.replays import (  # noqa: F401
        alpaca,
        binance,
        coinbase,
        home_assistant,
        jetstream,
        kraken,
    )


__all__ = ["FEEDS", "Entry", "Ledger", "ReplayServer", "load_feeds"]
