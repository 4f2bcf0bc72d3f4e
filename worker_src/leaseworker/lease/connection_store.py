"""The connection items' store: claims, renewals, checkpoints and releases (docs/design.md §2a).

Every connection item is written here, in both lease modes: connection mode renews each lease
through it; session mode (lease/session_leases.py) claims and releases through it.

Every write that acts on a lease is conditioned on owner and epoch; a lost race comes back as
a value (`Lost`, `False`), while throttles and outages raise `StoreError` subclasses. Every
call has a deadline (lease/dynamodb.call_with_deadline). `ReturnValuesOnConditionCheckFailure=ALL_OLD`
tells us who holds a lease without a second read.

Its reads (one item, the free index) are in lease/connection_reads.py, and the expressions its
writes use in lease/connection_expressions.py.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from leaseworker.clock import monotonic
from leaseworker.lease import connection_expressions
from leaseworker.lease.connection_expressions import (
    COND_ACQUIRE,
    COND_HELD,
    COND_RENEW,
    CURSOR_NAMES,
    SET_CURSOR,
    cursor_names,
    cursor_value,
)
from leaseworker.lease.connection_reads import ConnectionReads
from leaseworker.lease.dynamodb import (
    CONDITION_FAILED,
    error_code,
    now_ms,
    old_item,
    translate_client_error,
)
from leaseworker.lease.errors import (
    AcquireUncertain,
    StoreThrottled,
    StoreUnavailable,
)
from leaseworker.lease.model import (
    NO_CHECKPOINT,
    STARTED,
    ConnectionItem,
    Lease,
    MalformedItem,
    local_deadline,
)
from leaseworker.lease.results import Acquired, AcquireResult, Lost, Malformed, Renewed, RenewResult, Stopped


class ConnectionStore(ConnectionReads):
    """Conditional writes of connection items, each with a deadline; the reads are ConnectionReads'."""

    # ------------------------------------------------------------------ lease operations

    async def acquire(self, connection_id: str, me: str) -> AcquireResult:
        """Claim an expired or free lease. Raises AcquireUncertain when the reply was lost."""
        sent_at = monotonic()
        now = now_ms()
        expires = now + self._lease_ms
        try:
            response = await self._call(
                self._client.update_item(
                    TableName=self._table,
                    Key={"connection_id": {"S": connection_id}},
                    UpdateExpression=(
                        "SET lease_owner = :me, lease_expires_at_ms = :expires, updated_at_ms = :now "
                        "ADD lease_epoch :one"
                    ),
                    ConditionExpression=COND_ACQUIRE,
                    ExpressionAttributeValues={
                        ":me": {"S": me},
                        ":expires": {"N": str(expires)},
                        ":now": {"N": str(now)},
                        ":one": {"N": "1"},
                        ":started": {"S": STARTED},
                        ":now_minus_skew": {"N": str(now - self._settings.max_clock_skew_ms)},
                    },
                    ReturnValues="ALL_OLD",
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
            )
        except ClientError as error:
            if error_code(error) != CONDITION_FAILED:
                raise translate_client_error(error) from error
            lost = _lost_from(error, "not acquirable")
            if lost.holder != me:
                return lost
            # Held by us: an earlier attempt of this very call landed and its reply was lost (the
            # SDK retried). Read it back like a timeout (review 2026-12-05, I).
            raise AcquireUncertain(
                lost.reason, connection_id=connection_id, sent_at=sent_at, expires_at_ms=expires
            ) from None
        except (StoreUnavailable, StoreThrottled) as error:
            # A throttled last attempt may follow an earlier one that landed: uncertain too.
            raise AcquireUncertain(
                str(error), connection_id=connection_id, sent_at=sent_at, expires_at_ms=expires
            ) from error
        old = response.get("Attributes", {})
        epoch = int(old.get("lease_epoch", {}).get("N", "0")) + 1
        lease = Lease(
            connection_id=connection_id,
            epoch=epoch,
            owner=me,
            ws_url="",
            start_seq=NO_CHECKPOINT,
            valid_until=local_deadline(sent_at, self._settings),
        )
        try:
            previous = ConnectionItem.from_attributes(old)
        except MalformedItem as problem:
            await self.mark_failed(lease, str(problem))
            return Malformed(connection_id, str(problem))
        lease.resume_from(previous, previous.last_seq, previous.cursor)
        return Acquired(lease, previous)

    async def resolve_uncertain(self, uncertain: AcquireUncertain, me: str) -> Acquired | None:
        """After an AcquireUncertain: adopt the lease if our very write was applied.

        Our write is recognised by its exact expiry value. Its local deadline counts from when
        it was sent, as for any acquisition. An item that carries our id but another expiry is
        a stale lease of ours that nothing here serves: it is released (owner + epoch).
        """
        item = await self.get(uncertain.connection_id)
        if item is None or item.lease_owner != me:
            return None
        lease = Lease(
            connection_id=item.connection_id,
            epoch=item.lease_epoch,
            owner=me,
            ws_url=item.ws_url,
            start_seq=item.last_seq,
            valid_until=local_deadline(uncertain.sent_at, self._settings),
        )
        lease.resume_from(item, item.last_seq, item.cursor)
        if item.lease_expires_at_ms == uncertain.expires_at_ms:
            return Acquired(lease, None)
        await self.release(lease, None)
        return None

    async def renew(self, lease: Lease, *, timeout: float) -> RenewResult:
        """Extend one lease; the caller sets `timeout` no later than this renewal's own local
        validity (`model.renewal_timeout`).

        The expiry only moves forward. A renewal refused only because the stored expiry is
        already at or past ours (a newer pipelined renewal landed first, or this call's own
        earlier attempt did and the SDK retried) is `Renewed`: the item is still ours, STARTED,
        and expires no sooner than this write would have made it, which is all the holder's
        deadline from this send time relies on.
        """
        now = now_ms()
        try:
            await self._call(
                self._client.update_item(
                    TableName=self._table,
                    Key={"connection_id": {"S": lease.connection_id}},
                    UpdateExpression="SET lease_expires_at_ms = :expires",
                    ConditionExpression=COND_RENEW,
                    ExpressionAttributeValues={
                        ":me": {"S": lease.owner},
                        ":epoch": {"N": str(lease.epoch)},
                        ":started": {"S": STARTED},
                        ":expires": {"N": str(now + self._lease_ms)},
                    },
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                ),
                timeout=timeout,
            )
        except ClientError as error:
            if error_code(error) != CONDITION_FAILED:
                raise translate_client_error(error) from error
            old = old_item(error)
            if not _held_by(old, lease):
                return _lost_from(error, "renewal refused")
            if old.get("desired_state", {}).get("S") != STARTED:
                return Stopped()
            return Renewed()  # superseded: the stored expiry is at or past the one we sent
        return Renewed()

    async def checkpoint(self, lease: Lease, seq: int, cursor: str | None = None) -> bool:
        """Record that the sink durably accepted everything up to `seq`. False: we lost the lease.

        A refused condition is told apart with ALL_OLD: still ours but already at or past `seq`
        (a retried or reordered write) is success; another owner or epoch is a lost lease.
        """
        try:
            await self._call(
                self._client.update_item(
                    TableName=self._table,
                    Key={"connection_id": {"S": lease.connection_id}},
                    UpdateExpression=f"SET last_seq = :seq, updated_at_ms = :now, {SET_CURSOR}",
                    # Read at call time: the chaos suite's checkpoint-epoch switch replaces it there.
                    ConditionExpression=connection_expressions.COND_CHECKPOINT,
                    ExpressionAttributeValues={
                        ":me": {"S": lease.owner},
                        ":epoch": {"N": str(lease.epoch)},
                        ":seq": {"N": str(seq)},
                        ":now": {"N": str(now_ms())},
                    }
                    | cursor_value(cursor),
                    ExpressionAttributeNames=CURSOR_NAMES,
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
            )
        except ClientError as error:
            if error_code(error) != CONDITION_FAILED:
                raise translate_client_error(error) from error
            return _held_by(old_item(error), lease)
        return True

    async def release(self, lease: Lease, last_seq: int | None, cursor: str | None = None) -> bool:
        """Give the lease up at once (expiry 0), writing the final checkpoint with it."""
        update = "SET lease_expires_at_ms = :zero, updated_at_ms = :now REMOVE lease_owner"
        values: dict[str, Any] = {":zero": {"N": "0"}, ":now": {"N": str(now_ms())}}
        if last_seq is not None and last_seq > lease.start_seq:
            update = (
                f"SET lease_expires_at_ms = :zero, updated_at_ms = :now, last_seq = :seq, {SET_CURSOR} "
                "REMOVE lease_owner"
            )
            values |= {":seq": {"N": str(last_seq)}} | cursor_value(cursor)
        return await self._conditional(lease, update, values)

    async def record_failure(self, lease: Lease, reason: str) -> bool:
        return await self._conditional(
            lease,
            "SET last_error = :error, updated_at_ms = :now ADD failures :one",
            {":error": {"S": reason[:500]}, ":now": {"N": str(now_ms())}, ":one": {"N": "1"}},
        )

    async def mark_failed(
        self, lease: Lease, reason: str, last_seq: int | None = None, cursor: str | None = None
    ) -> bool:
        """A connection that can never work: stop it with a reason instead of bouncing it.

        `last_seq`, what the sink accepted, is written too (only forward), so that an operator's
        `connections start` resumes after it instead of replaying."""
        update = (
            "SET desired_state = :stopped, last_error = :error, lease_expires_at_ms = :zero, "
            "updated_at_ms = :now"
        )
        values: dict[str, Any] = {
            ":stopped": {"S": "STOPPED"},
            ":error": {"S": f"failed: {reason}"[:500]},
            ":zero": {"N": "0"},
            ":now": {"N": str(now_ms())},
            ":one": {"N": "1"},
        }
        if last_seq is not None and last_seq > lease.start_seq:
            update += f", last_seq = :seq, {SET_CURSOR}"
            values |= {":seq": {"N": str(last_seq)}} | cursor_value(cursor)
        return await self._conditional(lease, f"{update} ADD failures :one REMOVE lease_owner", values)

    # ------------------------------------------------------------------ plumbing

    @property
    def _lease_ms(self) -> int:
        return int(self._settings.lease_seconds * 1000)

    async def _conditional(self, lease: Lease, update: str, values: dict[str, Any]) -> bool:
        try:
            await self._call(
                self._client.update_item(
                    TableName=self._table,
                    Key={"connection_id": {"S": lease.connection_id}},
                    UpdateExpression=update,
                    ConditionExpression=COND_HELD,
                    ExpressionAttributeValues={
                        ":me": {"S": lease.owner},
                        ":epoch": {"N": str(lease.epoch)},
                        **values,
                    },
                    **cursor_names(update),
                )
            )
        except ClientError as error:
            if error_code(error) == CONDITION_FAILED:
                return False
            raise translate_client_error(error) from error
        return True


def _held_by(old: dict[str, Any], lease: Lease) -> bool:
    """Whether an item (as returned by ALL_OLD) is still held under `lease`'s owner and epoch."""
    owner = old.get("lease_owner", {}).get("S")
    epoch = old.get("lease_epoch", {}).get("N")
    return bool(owner == lease.owner and epoch == str(lease.epoch))


def _lost_from(error: ClientError, reason: str) -> Lost:
    old = old_item(error)
    if not old:
        return Lost(None, None, f"{reason}: no such connection")
    holder = old.get("lease_owner", {}).get("S")
    epoch_raw = old.get("lease_epoch", {}).get("N")
    state = old.get("desired_state", {}).get("S")
    detail = f"held by {holder} at epoch {epoch_raw}" if holder else f"desired_state {state}"
    return Lost(holder, int(epoch_raw) if epoch_raw else None, f"{reason}: {detail}")
