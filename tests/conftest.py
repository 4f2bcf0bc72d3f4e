"""Shared fixtures: the tests start their own servers on free ports and stop them by pid."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from leaseworker_dev.local.services import LOCAL_CREDENTIALS, start_dynamodb_local, start_moto_server

# Local emulators accept any credentials; make sure nothing reaches for a real account.
for _key, _value in LOCAL_CREDENTIALS.items():
    os.environ[_key] = _value
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"


@pytest.fixture(scope="session")
def dynamodb_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A DynamoDB Local server for the whole run (the lease table is never mocked)."""
    log = Path(tmp_path_factory.mktemp("dynamodb-local")) / "dynamodb-local.log"
    process = start_dynamodb_local(log_path=log)
    try:
        yield process.url
    finally:
        process.stop()


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto server for SQS and Kinesis (never for the lease table)."""
    log = Path(tmp_path_factory.mktemp("moto")) / "moto.log"
    process = start_moto_server(log_path=log)
    try:
        yield process.url
    finally:
        process.stop()
