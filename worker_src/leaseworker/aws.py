"""AWS clients with bounded retries and timeouts, opened once in an AsyncExitStack."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

import aioboto3
from aiobotocore.config import AioConfig

from leaseworker.no_linger import NoLingerAIOHTTPSession
from leaseworker.settings import Settings

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb import DynamoDBClient
    from types_aiobotocore_sqs import SQSClient

# Lease calls carry their own asyncio deadline; the SDK may retry once inside it, no more.
# Standard mode with 10 attempts held one call for 48 s in a throttling storm.
# `total_max_attempts` counts attempts; botocore's `max_attempts` counts *retries* (n means
# n + 1 attempts), which made this client try 3 times instead of 2 (review 2026-12-05, G).
# Sockets close with RST and abandoned calls are aborted (leaseworker.no_linger): a write the
# worker gave up on, or one queued when the process died, cannot land after a fence (§2d, §2e).
LEASE_CLIENT_MAX_ATTEMPTS = 2  # the first attempt and one SDK retry
LEASE_READ_TIMEOUT_SECONDS = 4.0  # the least the lease client waits for a reply's bytes
LEASE_CLIENT_CONFIG = AioConfig(
    connect_timeout=2,
    read_timeout=LEASE_READ_TIMEOUT_SECONDS,
    retries={"total_max_attempts": LEASE_CLIENT_MAX_ATTEMPTS, "mode": "standard"},
    max_pool_connections=64,
    http_session_cls=NoLingerAIOHTTPSession,
)


def lease_read_timeout(settings: Settings) -> float:
    """The lease client's read timeout: at least the longest round trip that keeps a lease
    (LEASE_SECONDS − margin − HEARTBEAT_SECONDS with pipelined renewals and heartbeats,
    worker/keeper.py). A fixed 4 s cut every attempt of a slower but still timely call at the
    defaults (a 5 s round trip against a 20 s lease failed both attempts), although its own
    deadline (`model.renewal_timeout`, 17 s) had room. Every call stays bounded by its asyncio
    deadline; the SDK retries only what fails before it (a reset, a refused connect)."""
    keeps = settings.lease_seconds - settings.fence_margin_seconds - settings.heartbeat_seconds
    return max(LEASE_READ_TIMEOUT_SECONDS, keeps)


def lease_client_config(settings: Settings) -> AioConfig:
    return AioConfig(
        connect_timeout=2,
        read_timeout=lease_read_timeout(settings),
        retries={"total_max_attempts": LEASE_CLIENT_MAX_ATTEMPTS, "mode": "standard"},
        max_pool_connections=64,
        http_session_cls=NoLingerAIOHTTPSession,
    )


# SQS long polls wait up to 20 s for a message: the read timeout must outlast them.
NOTIFY_CLIENT_CONFIG = AioConfig(
    connect_timeout=2, read_timeout=25, retries={"max_attempts": 3, "mode": "standard"}
)
# Operator tools (the CLI, the local fleet): someone is waiting at a terminal, so fail within a
# few seconds when the endpoint is unreachable rather than sit through the SDK's retries.
CLI_CLIENT_CONFIG = AioConfig(
    connect_timeout=2, read_timeout=10, retries={"max_attempts": 2, "mode": "standard"}
)


async def dynamodb_client(
    stack: AsyncExitStack, session: aioboto3.Session, settings: Settings
) -> DynamoDBClient:
    client: DynamoDBClient = await stack.enter_async_context(
        session.client(
            "dynamodb",
            endpoint_url=settings.endpoint_url,
            region_name=settings.region,
            config=lease_client_config(settings),
        )
    )
    return client


async def sqs_client(stack: AsyncExitStack, session: aioboto3.Session, settings: Settings) -> SQSClient:
    client: SQSClient = await stack.enter_async_context(
        session.client(
            "sqs",
            region_name=settings.region,
            config=NOTIFY_CLIENT_CONFIG,
        )
    )
    return client
