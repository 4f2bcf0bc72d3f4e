"""`kinesis:<stream>`: batched PutRecords, partition key = connection_id (docs/design.md §5).

write() returns only when Kinesis has accepted every record of the batch, or raises SinkError
once `deadline_seconds` have passed (so a throttling storm cannot hold a write, and with it the
checkpoint and the lease's self-fencing checks, for long).

Batching: records are sent in order, in calls of at most 500 records and 5 MiB (data plus
partition key, as Kinesis counts it). Calls are sequential, never concurrent, so that a
connection's records enter the stream in seq order.

Partial failures and ordering (go-back-N per connection). PutRecords may accept some records of a
call and reject others (FailedRecordCount > 0), and Kinesis documents that this makes it
unordered. Retrying only the failed records would put a connection's seq 5 after its seq 6, 7.
Instead, for each connection with a failure, the failed record AND every later record of that
connection are resent (records of connections without failures are not). The price is extra
duplicates under throttling, which at-least-once allows. The result: for every connection, the
stream read in shard order contains its records as runs of ascending seq, where each run resumes
at or before the point where the previous one broke. A consumer that keeps the next expected seq
per connection and drops everything else reads a complete, in-order sequence: the same filter
that already removes the replay duplicates of a failover (leaseworker.consumer, docs/design.md §5).

Errors: throttling, 5xx and network errors are retried (whole call) with capped, full-jitter
exponential backoff until the deadline. Requests that can never succeed (validation, access
denied, missing stream, a record over 1 MiB) raise SinkError at once. A record over 1 MiB is
`permanent`: the records before it are written first, and the session counts it as a failure at
that position, so the connection is marked failed (with the size in `last_error`) rather than
resubscribed forever.

Retries are the sink's alone (docs/design.md §2d). The client must have no SDK-level retry
(`retries={"total_max_attempts": 1}`, see factory.py): an SDK retry resends a call on a new connection
without asking whether the lease is still valid. Before every call, first or retry, `valid()` is
asked; once it says False nothing more is sent. When the sink gives up (deadline, lease gone,
caller's cancellation) the in-flight call's connection is aborted, not returned to the pool or
closed gracefully, and its socket closes with RST (leaseworker.no_linger): write() returns only
after that, so nothing it abandoned can land after whatever the caller does next (a release).
SinkError.accepted is then the batch's leading run that Kinesis accepted in full.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from botocore.exceptions import BotoCoreError, ClientError

from leaseworker.no_linger import abandoned_sockets_closed
from leaseworker.records import SinkRecord
from leaseworker.sinks.base import SinkError, Validity, always_valid

if TYPE_CHECKING:
    from types_aiobotocore_kinesis import KinesisClient
    from types_aiobotocore_kinesis.type_defs import (
        PutRecordsOutputTypeDef,
        PutRecordsRequestEntryTypeDef,
    )

MAX_RECORDS_PER_CALL: Final = 500
MAX_BYTES_PER_CALL: Final = 5 * 1024 * 1024
MAX_BYTES_PER_RECORD: Final = 1024 * 1024  # data + partition key
BACKOFF_BASE_SECONDS: Final = 0.05
BACKOFF_CAP_SECONDS: Final = 2.0
BACKOFF_MAX_DOUBLINGS: Final = 16  # 0.05 s * 2**16 is far past the cap already

# Error codes that no retry can fix: fail the batch at once so the caller sees the cause.
FATAL_ERROR_CODES: Final = frozenset(
    {
        "ValidationException",
        "InvalidArgumentException",
        "AccessDeniedException",
        "ResourceNotFoundException",
        "UnrecognizedClientException",
        "KMSAccessDeniedException",
        "KMSDisabledException",
        "KMSNotFoundException",
        "KMSInvalidStateException",
    }
)


@dataclass(frozen=True, slots=True)
class _Entry:
    partition_key: str
    data: bytes
    index: int = 0  # position in the batch given to write()

    @property
    def size(self) -> int:
        return len(self.data) + len(self.partition_key.encode("utf-8"))


def plan_calls(entries: Sequence[_Entry]) -> int:
    """How many leading entries fit in one PutRecords call (at least one)."""
    total = 0
    for count, entry in enumerate(entries):
        if count == MAX_RECORDS_PER_CALL or (count and total + entry.size > MAX_BYTES_PER_CALL):
            return count
        total += entry.size
    return len(entries)


def go_back_n(sent: Sequence[_Entry], results: Sequence[bool]) -> list[_Entry]:
    """The entries of one call to resend: for each partition key with a failure, its first
    failed entry and everything after it (results[i] is True when sent[i] was accepted)."""
    broken: set[str] = set()
    resend: list[_Entry] = []
    for entry, accepted in zip(sent, results, strict=True):
        if not accepted:
            broken.add(entry.partition_key)
        if entry.partition_key in broken:
            resend.append(entry)
    return resend


class KinesisSink:
    def __init__(
        self,
        client: KinesisClient,
        stream_name: str,
        *,
        deadline_seconds: float = 10.0,
        random_uniform: Callable[[float, float], float] = random.uniform,
    ) -> None:
        if deadline_seconds <= 0:
            raise ValueError(f"deadline_seconds must be > 0, got {deadline_seconds!r}")
        self._client = client
        self._stream = stream_name
        self._deadline = deadline_seconds
        self._uniform = random_uniform
        self._closed = False
        self.calls = 0  # PutRecords calls made, for tests and metrics
        self.records_resent = 0

    async def write(self, records: Sequence[SinkRecord], *, valid: Validity = always_valid) -> None:
        if self._closed:
            raise SinkError(f"kinesis sink for {self._stream} is closed")
        entries = [
            _Entry(record.connection_id, record.to_json().encode("utf-8"), index)
            for index, record in enumerate(records)
        ]
        for entry in entries:
            if entry.size > MAX_BYTES_PER_RECORD:
                # What comes before it is written first, so that its position is the one reported.
                if entry.index:
                    await self.write(records[: entry.index], valid=valid)
                raise SinkError(
                    f"kinesis {self._stream}: a record of {entry.partition_key} is {entry.size} bytes,"
                    f" over the {MAX_BYTES_PER_RECORD}-byte PutRecords limit",
                    accepted=entry.index,
                    permanent=True,
                )
        pending = entries  # not yet known to be accepted, in the order they will be sent
        last_error = "no attempt completed"
        try:
            async with asyncio.timeout(self._deadline):
                attempt = 0
                while pending:
                    if not valid():
                        raise SinkError(
                            f"kinesis {self._stream}: lease no longer valid; "
                            f"{len(pending)} of {len(entries)} records not sent",
                            accepted=_accepted_prefix(pending, len(entries)),
                        )
                    count = plan_calls(pending)
                    chunk, rest = pending[:count], pending[count:]
                    try:
                        accepted = await self._put(chunk)
                    except _Retryable as exc:
                        last_error = str(exc)
                        await self._backoff(attempt)
                        attempt += 1
                        continue
                    resend = go_back_n(chunk, accepted)
                    if not resend:
                        pending, attempt = rest, 0
                        continue
                    last_error = f"{len(chunk) - sum(accepted)} of {len(chunk)} records failed"
                    self.records_resent += len(resend)
                    # The resent entries of a key precede its entries in `rest`: order is kept.
                    pending = resend + rest
                    await self._backoff(attempt)
                    attempt += 1
        except TimeoutError:
            await abandoned_sockets_closed()
            raise SinkError(
                f"kinesis {self._stream}: batch not accepted within {self._deadline:g}s ({last_error})",
                accepted=_accepted_prefix(pending, len(entries)),
            ) from None
        except BaseException:  # SinkError, or the caller's cancellation: re-raised as it is
            await abandoned_sockets_closed()
            raise

    async def _put(self, chunk: Sequence[_Entry]) -> list[bool]:
        request: list[PutRecordsRequestEntryTypeDef] = [
            {"Data": entry.data, "PartitionKey": entry.partition_key} for entry in chunk
        ]
        self.calls += 1
        try:
            if self._stream.startswith("arn:"):
                response = await self._client.put_records(Records=request, StreamARN=self._stream)
            else:
                response = await self._client.put_records(Records=request, StreamName=self._stream)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in FATAL_ERROR_CODES:
                raise SinkError(f"kinesis {self._stream}: {code}: {exc}") from exc
            raise _Retryable(f"{code or 'ClientError'}: {exc}") from exc
        except BotoCoreError as exc:  # connection refused/reset, read timeout, …
            raise _Retryable(f"{type(exc).__name__}: {exc}") from exc
        return _accepted(response, len(chunk))

    async def _backoff(self, attempt: int) -> None:
        # Full jitter (AWS Architecture Blog, "Exponential Backoff and Jitter"); the deadline
        # around write() cuts the last sleep short.
        # The exponent is capped too: without jitter sleeps, attempts could count past a float.
        ceiling = min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2 ** min(attempt, BACKOFF_MAX_DOUBLINGS))
        await asyncio.sleep(self._uniform(0.0, ceiling))

    async def close(self) -> None:
        # Nothing is buffered between writes; the client belongs to the caller's exit stack.
        self._closed = True


def _accepted_prefix(pending: Sequence[_Entry], total: int) -> int:
    """How many leading records of the batch are accepted: all before the first pending one."""
    return min((entry.index for entry in pending), default=total)


class _Retryable(Exception):
    """A whole PutRecords call failed in a way that a later attempt may not."""


def _accepted(response: PutRecordsOutputTypeDef, expected: int) -> list[bool]:
    results = response.get("Records", [])
    if len(results) != expected:
        raise _Retryable(f"PutRecords returned {len(results)} results for {expected} records")
    accepted = [not entry.get("ErrorCode") for entry in results]
    if response.get("FailedRecordCount", 0) and all(accepted):
        # Inconsistent response: trust the count, resend everything (duplicates are allowed).
        return [False] * expected
    return accepted
