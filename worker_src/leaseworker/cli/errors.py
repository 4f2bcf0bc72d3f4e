"""Turn every expected failure into one clear line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Coroutine
from typing import Any, TypeVar

import click
from botocore.exceptions import (
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)

from leaseworker.lease.admin_errors import ConnectionExists, UnknownConnection
from leaseworker.lease.errors import StoreError, StoreUnavailable, TableMissing
from leaseworker.lease.model import InvalidConnectionId
from leaseworker.settings import SettingsError
from leaseworker.worker.fenced import EXIT_FENCED, WorkerFenced

T = TypeVar("T")

EXIT_USAGE = 2
EXIT_FAILURE = 1


class OneLineError(RuntimeError):
    """An error whose str() is the whole message for the operator, with what to do (for example
    a local service that could not be started, leaseworker_dev/local/services.py)."""


class CliError(click.ClickException):
    """One line on stderr, exit 1: the operation failed."""

    exit_code = EXIT_FAILURE

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True)


class FencedExit(CliError):
    """One line on stderr, exit 3: the worker's session was fenced (see worker/fenced.py)."""

    exit_code = EXIT_FENCED


class CliUsageError(CliError):
    """One line on stderr, exit 2: the input was invalid."""

    exit_code = EXIT_USAGE


def check_wait_seconds(wait_seconds: float) -> None:
    """`--wait` of `remove --force` and `apply --prune`: a finite number of seconds > 0."""
    if not math.isfinite(wait_seconds) or wait_seconds <= 0:
        raise CliUsageError(f"invalid --wait {wait_seconds!r}: must be a finite number of seconds > 0")


def run_async(coro: Coroutine[Any, Any, T], *, table: str | None = None, endpoint: str | None = None) -> T:
    """Run `coro`, translating known failures into CliError."""
    try:
        return asyncio.run(coro)
    except Exception as error:
        translated = translate(error, table=table, endpoint=endpoint)
        if translated is None:
            raise
        raise translated from None


def translate(error: BaseException, *, table: str | None, endpoint: str | None) -> CliError | None:
    """The one-line CliError for an expected failure; None for anything else (a bug: let it show)."""
    if isinstance(error, WorkerFenced):
        return FencedExit(str(error))
    where = endpoint or "the default AWS endpoint"
    # The lease store wraps SDK errors in StoreUnavailable; the cause says what really happened.
    root = _root_cause(error)
    if isinstance(root, (NoCredentialsError, PartialCredentialsError)):
        return CliError(
            "no AWS credentials: configure them (aws configure, AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY); DynamoDB Local accepts any values"
        )
    if isinstance(root, NoRegionError):
        return CliError(
            "no AWS region: set AWS_REGION (or AWS_DEFAULT_REGION, or a region in your AWS profile)"
        )
    if isinstance(error, (SettingsError, InvalidConnectionId, ConnectionExists)):
        return CliUsageError(str(error))
    if isinstance(error, UnknownConnection):
        return CliError(f"{error} {table!r}: `leaseworker connections list` shows the ids")
    if isinstance(error, TableMissing):
        return CliError(
            f"table {table!r} does not exist at {where}: run `leaseworker table create` "
            "(or deploy the stack and pass its TableName output with --table)"
        )
    if isinstance(root, (EndpointConnectionError, ConnectTimeoutError)):
        return CliError(f"cannot reach DynamoDB at {where}: {root}")
    if isinstance(error, StoreUnavailable):
        return CliError(f"DynamoDB at {where} failed: {root if root is not error else error}")
    if isinstance(error, (StoreError, OneLineError)):
        return CliError(str(error))
    if isinstance(error, ValueError):
        return CliUsageError(str(error))
    return None


def _root_cause(error: BaseException) -> BaseException:
    seen = {id(error)}
    while error.__cause__ is not None and id(error.__cause__) not in seen:
        error = error.__cause__
        seen.add(id(error))
    return error
