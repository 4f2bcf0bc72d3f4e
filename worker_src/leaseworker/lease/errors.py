"""Typed failures of the lease store. A lost race is never one of these: it is a return value."""

from __future__ import annotations


class StoreError(Exception):
    """The store could not answer; the caller keeps its local deadline and retries later."""


class StoreThrottled(StoreError):
    """DynamoDB throttled the call (ProvisionedThroughputExceeded, ThrottlingException, ...)."""


class StoreUnavailable(StoreError):
    """The call timed out, the endpoint was unreachable, or DynamoDB returned a server error."""


class StoreRejected(StoreError):
    """DynamoDB refused the request itself (validation, access denied): retrying will not help."""


class TableMissing(StoreError):
    """The lease table does not exist."""
