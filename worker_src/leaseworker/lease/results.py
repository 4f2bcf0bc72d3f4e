"""What a conditional write on a connection item came to: values, not exceptions (docs/design.md §2a).

A lost race is a value the caller decides on (`Lost`); throttles and outages raise StoreError
subclasses (lease/errors.py). Shared by both lease modes' stores and the worker's loops.
"""

from __future__ import annotations

from dataclasses import dataclass

from leaseworker.lease.model import ConnectionItem, Lease


@dataclass(frozen=True, slots=True)
class Acquired:
    lease: Lease
    previous: ConnectionItem | None  # the item before our write: who held it, when it expired


@dataclass(frozen=True, slots=True)
class Lost:
    """Someone else won, or the connection is not acquirable (stopped, gone, live)."""

    holder: str | None
    epoch: int | None
    reason: str


@dataclass(frozen=True, slots=True)
class Malformed:
    """We won the write but the item cannot be served; it has been marked failed."""

    connection_id: str
    reason: str


AcquireResult = Acquired | Lost | Malformed


@dataclass(frozen=True, slots=True)
class Renewed:
    pass


@dataclass(frozen=True, slots=True)
class Stopped:
    """We still own it, but an operator set desired_state = STOPPED: close and release."""


RenewResult = Renewed | Lost | Stopped
