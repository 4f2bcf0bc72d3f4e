"""The worker's event loop: uvloop's (pinned in requirements.txt, so the image always has it).

Measured by bench/delivery.py (issue 25, docs/benchmarks.md "P5 against its limit"): with uvloop
the worker process delivers sparse traffic (one frame per socket read, the common case) at
about 1.15-1.2x the messages per CPU second of asyncio's own loop, and dense traffic at about
the same. Nothing in the worker depends on the loop's kind: deadlines are read from
time.monotonic() and converted where a timer needs loop time (worker/fence.py), and uvloop's
loop time (libuv's, in milliseconds, read once per iteration) only makes a timer fire up to a
millisecond off, which every timer here checks again. Without uvloop (a development install
that skipped it), asyncio's loop runs the same code.
"""

from __future__ import annotations

import asyncio


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - the image and the dev install both have it
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
