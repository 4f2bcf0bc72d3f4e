"""Waiting on events with a timeout, without leaving waiter tasks behind."""

from __future__ import annotations

import asyncio


async def wait_any(timeout: float | None, *events: asyncio.Event) -> None:
    """Sleep up to `timeout` (None: no limit), waking early when any event is set."""
    if any(event.is_set() for event in events):
        return
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
