"""The ECS task this worker runs in, for its session item (read once at start, best effort)."""

from __future__ import annotations

import asyncio
import json
import os

import aiohttp

METADATA_TIMEOUT_SECONDS = 1.0


async def ecs_task_arn() -> str | None:
    """The task ARN from the ECS task metadata endpoint v4, or None outside ECS or on any error."""
    base = os.environ.get("ECS_CONTAINER_METADATA_URI_V4")
    if not base:
        return None
    try:
        async with (
            asyncio.timeout(METADATA_TIMEOUT_SECONDS),
            aiohttp.ClientSession() as http,
            http.get(f"{base.rstrip('/')}/task") as response,
        ):
            payload = json.loads(await response.text())
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    arn = payload.get("TaskARN") if isinstance(payload, dict) else None
    return arn if isinstance(arn, str) else None
