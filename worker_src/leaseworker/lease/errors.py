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


class AcquireUncertain(StoreUnavailable):
    """An acquire timed out or lost its connection: DynamoDB may have applied it or not.

    Carries what identifies our write, so that a later read can tell whether we hold the lease
    (adopt it) or not, instead of leaving an applied claim orphaned until it expires.
    """

    def __init__(self, message: str, *, connection_id: str, sent_at: float, expires_at_ms: int) -> None:
        super().__init__(message)
        self.connection_id = connection_id
        self.sent_at = sent_at
        self.expires_at_ms = expires_at_ms
