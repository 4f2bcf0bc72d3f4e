"""The lease stores' contract, run against both DynamoDBs: DynamoDB Local, and the in-memory client
the simulations run on (bench/simulator/memory_dynamodb.py). Every test here runs twice; one that
needs the network client itself (botocore's events, an endpoint to cut, a proxy) asks for
`network_client` and is skipped on the in-memory one."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from types_aiobotocore_dynamodb import DynamoDBClient

from bench.simulator.memory_dynamodb import MemoryDynamoDB
from bench.simulator.memory_table import Database
from leaseworker.lease.admin import LeaseTableAdmin

BACKENDS = ("dynamodb-local", "memory")


@pytest.fixture(params=BACKENDS)
def ddb(request: pytest.FixtureRequest, dynamodb_local_client: DynamoDBClient) -> Any:
    if request.param == "memory":
        return MemoryDynamoDB(Database())
    return dynamodb_local_client


@pytest.fixture
async def table(ddb: DynamoDBClient) -> str:
    name = f"leases-{uuid.uuid4().hex[:8]}"
    if isinstance(ddb, MemoryDynamoDB):
        ddb.database.create_table(name)
    else:
        assert await LeaseTableAdmin(ddb, name).create_table()
    return name


@pytest.fixture
def network_client(ddb: DynamoDBClient) -> DynamoDBClient:
    if isinstance(ddb, MemoryDynamoDB):
        pytest.skip("needs the network client (botocore's events, an endpoint, a proxy)")
    return ddb
