"""The releases of one rebalance round share one published heartbeat (worker/heartbeat.py), and
a release asked after a publish has read the load gets a new one."""

from __future__ import annotations

import asyncio
from typing import Any

from leaseworker.lease.liveness import SessionValidity
from leaseworker.lease.ownership import ConnectionLeases
from leaseworker.observability.tracing import Tracing
from leaseworker.settings import Settings
from leaseworker.worker.heartbeat import SessionHeartbeat
from leaseworker.worker.registry import Registry


class CountingSessions:
    """A session store that records each heartbeat's load and answers after a short delay."""

    def __init__(self) -> None:
        self.loads: list[int] = []
        self.sent = asyncio.Event()

    async def heartbeat(self, worker_id: str, *, load: int, **_: Any) -> None:
        self.loads.append(load)
        self.sent.set()
        await asyncio.sleep(0.05)


def heartbeat(sessions: CountingSessions, settings: Settings) -> SessionHeartbeat:
    return SessionHeartbeat(
        sessions=sessions,  # type: ignore[arg-type]  # only heartbeat() is called
        ownership=ConnectionLeases(None, None, settings),  # type: ignore[arg-type]  # no lease held
        registry=Registry(),
        validity=SessionValidity(settings),
        settings=settings,
        tracing=Tracing(None),
        on_fenced=lambda fenced: None,
    )


async def test_releases_asked_while_a_beat_is_in_flight_share_one_publish(settings: Settings) -> None:
    sessions = CountingSessions()
    beats = heartbeat(sessions, settings)
    periodic = asyncio.create_task(beats.beat())
    await sessions.sent.wait()  # the periodic beat is in flight: publishes wait for it
    publishes = []
    for _ in range(3):  # releases ending one after another, each after the last one's publish exists
        publishes.append(asyncio.create_task(beats.publish_load()))
        await asyncio.sleep(0)
    await asyncio.gather(periodic, *publishes)
    assert len(sessions.loads) == 2  # the periodic beat and one shared publish


async def test_a_release_asked_after_the_load_was_read_gets_its_own_publish(settings: Settings) -> None:
    sessions = CountingSessions()
    beats = heartbeat(sessions, settings)
    first = asyncio.create_task(beats.publish_load())
    await sessions.sent.wait()  # the first publish has read the load and is in flight
    await asyncio.gather(first, beats.publish_load())
    assert len(sessions.loads) == 2
