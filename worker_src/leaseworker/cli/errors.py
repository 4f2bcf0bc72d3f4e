"""Turn every expected failure into one clear line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import click
from botocore.exceptions import NoCredentialsError, NoRegionError, PartialCredentialsError

from leaseworker.lease.admin import ConnectionExists, UnknownConnection
from leaseworker.lease.errors import StoreError, StoreUnavailable, TableMissing
from leaseworker.lease.model import InvalidConnectionId
from leaseworker.local.services import ServiceError
from leaseworker.settings import SettingsError

T = TypeVar("T")

EXIT_USAGE = 2
EXIT_FAILURE = 1


class CliError(click.ClickException):
    """One line on stderr, exit 1: the operation failed."""

    exit_code = EXIT_FAILURE

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True)


class CliUsageError(CliError):
    """One line on stderr, exit 2: the input was invalid."""

    exit_code = EXIT_USAGE


def run_async(coro: Coroutine[Any, Any, T], *, table: str | None = None, endpoint: str | None = None) -> T:
    """Run `coro`, translating known failures into CliError."""
    try:
        return asyncio.run(coro)
    except (SettingsError, InvalidConnectionId, ConnectionExists) as error:
        raise CliUsageError(str(error)) from None
    except UnknownConnection as error:
        raise CliError(str(error)) from None
    except TableMissing:
        raise CliError(
            f"table {table!r} does not exist at {endpoint or 'the default AWS endpoint'}: "
            "run `leaseworker table create` (or deploy the stack) first"
        ) from None
    except (NoCredentialsError, PartialCredentialsError):
        raise CliError(
            "no AWS credentials: configure them (aws configure, AWS_PROFILE or AWS_ACCESS_KEY_ID/"
            "AWS_SECRET_ACCESS_KEY); DynamoDB Local accepts any values"
        ) from None
    except NoRegionError:
        raise CliError("no AWS region: set AWS_REGION (or --region via your AWS profile)") from None
    except StoreUnavailable as error:
        where = endpoint or "the default AWS endpoint"
        raise CliError(f"DynamoDB unreachable at {where}: {error}") from None
    except (StoreError, ServiceError) as error:
        raise CliError(str(error)) from None
    except ValueError as error:
        raise CliUsageError(str(error)) from None
