"""Fixtures for the worker's integration tests: a fresh lease table per test on DynamoDB Local."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import aioboto3
import pytest
from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.aws import LEASE_CLIENT_CONFIG
from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.settings import Settings
from leaseworker_dev.local.proxy import TcpProxy


@pytest.fixture
async def dynamodb_local_client(dynamodb_endpoint: str) -> AsyncIterator[DynamoDBClient]:
    session = aioboto3.Session()
    async with session.client(
        "dynamodb", endpoint_url=dynamodb_endpoint, region_name="us-east-1", config=LEASE_CLIENT_CONFIG
    ) as client:
        yield client


@pytest.fixture
def ddb(dynamodb_local_client: DynamoDBClient) -> DynamoDBClient:
    """The lease table's client (the contract modules run on the in-memory one too: store_backends.py)."""
    return dynamodb_local_client


@pytest.fixture
async def table(ddb: DynamoDBClient) -> str:
    name = f"leases-{uuid.uuid4().hex[:8]}"
    assert await LeaseTableAdmin(ddb, name).create_table()
    return name


@pytest.fixture
def settings(table: str, dynamodb_endpoint: str) -> Settings:
    return Settings(
        table_name=table,
        lease_seconds=3.0,
        heartbeat_seconds=1.0,
        reconcile_seconds=1.0,
        checkpoint_seconds=1.0,
        max_clock_skew_ms=200,
        worker_id="test-worker",
        endpoint_url=dynamodb_endpoint,
        region="us-east-1",
    )


@pytest.fixture
async def dynamodb_proxy(dynamodb_endpoint: str) -> AsyncIterator[TcpProxy]:
    """A TCP proxy in front of DynamoDB Local: latency, blackholes and resets on demand."""
    target = urlsplit(dynamodb_endpoint)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 80)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()
