"""Connection items held by a session (docs/design.md §2b): claim free, claim from the dead, list by owner.

A session-held connection item carries `lease_owner`, `lease_epoch` and the expiry marker
`SESSION_HELD` (2^53 - 1): no connection-mode acquirer ever sees it as expired, the orphan
query (`expiry < now - skew`) never returns it, and holding it writes nothing per heartbeat.

- Claim a free connection: connection mode's acquire condition (`COND_ACQUIRE`), writing the
  marker instead of an expiry, epoch + 1.
- Claim a fenced session's connection: `lease_owner = :dead AND lease_epoch = :epoch AND
  desired_state = STARTED`, and, unless the fence is confirmed, the marker too (an observer's
  suspicion does not make a connection-mode lease claimable, §2.0). The claim writes
  max(item's last_seq, the dead holder's checkpoint at that epoch) into the item: DynamoDB has no
  max(), so the first attempt sets `last_seq = :resume` under `last_seq <= :resume`, and only if
  the item is already further does a second attempt claim without touching `last_seq`. The
  checkpoint therefore never moves backwards, and the common case is one write.
- Release, record a failure, mark failed: connection mode's owner + epoch writes (ConnectionStore).
  The item's `last_seq` equals the lease's `start_seq` while held (only claims and releases
  write it), so the release's `last_seq > start_seq` test keeps it moving only up.

The reads by owner (the `by-owner` index, then the items) are in lease/held_reads.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from leaseworker.clock import monotonic
from leaseworker.lease.attribute_values import failed_item, number, text
from leaseworker.lease.connection_expressions import COND_ACQUIRE, cursor_names, cursor_value
from leaseworker.lease.connection_store import ConnectionStore
from leaseworker.lease.dynamodb import call_with_deadline, now_ms
from leaseworker.lease.errors import AcquireUncertain, StoreThrottled, StoreUnavailable
from leaseworker.lease.held_reads import HeldReads, OwnedConnection
from leaseworker.lease.model import NO_CHECKPOINT, STARTED, ConnectionItem, Lease, MalformedItem
from leaseworker.lease.results import Acquired, AcquireResult, Lost, Malformed
from leaseworker.lease.vocabulary import SESSION_HELD
from leaseworker.settings import Settings

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb import DynamoDBClient


COND_FROM_DEAD = "lease_owner = :dead AND lease_epoch = :epoch AND desired_state = :started"
COND_FROM_DEAD_SESSION = f"{COND_FROM_DEAD} AND lease_expires_at_ms = :held"
COND_NOT_BEHIND = "(attribute_not_exists(last_seq) OR last_seq <= :resume)"

_CLAIM = "SET lease_owner = :me, lease_expires_at_ms = :expires, updated_at_ms = :now ADD lease_epoch :one"
_CLAIM_WITH_SEQ = (
    "SET lease_owner = :me, lease_expires_at_ms = :expires, updated_at_ms = :now, last_seq = :resume "
    "ADD lease_epoch :one"
)
# The same, for an entry that carries the cursor belonging to its seq (docs/design.md §5).
_CLAIM_WITH_SEQ_AND_CURSOR = _CLAIM_WITH_SEQ.replace(" ADD ", ", #cursor = :cursor ADD ")
COND_DEAD_HOLDS = "lease_owner = :dead AND lease_epoch = :epoch"
COND_DEAD_HOLDS_AS_READ = f"{COND_DEAD_HOLDS} AND lease_expires_at_ms = :expires"  # nothing renewed it
_FREE = "SET lease_expires_at_ms = :zero, updated_at_ms = :now REMOVE lease_owner"
_FREE_WITH_SEQ = (
    "SET lease_expires_at_ms = :zero, updated_at_ms = :now, last_seq = :resume REMOVE lease_owner"
)
_FREE_WITH_SEQ_AND_CURSOR = _FREE_WITH_SEQ.replace(" REMOVE ", ", #cursor = :cursor REMOVE ")


class SessionHeldStore:
    def __init__(self, client: DynamoDBClient, settings: Settings, *, call_timeout: float = 5.0) -> None:
        self._client = client
        self._settings = settings
        self._table = settings.table_name
        self._call_timeout = call_timeout
        self._reads = HeldReads(client, settings, call_timeout=call_timeout)
        self._leases = ConnectionStore(client, settings, call_timeout=call_timeout)

    async def claim_free(self, connection_id: str, me: str, *, valid_until: float) -> AcquireResult:
        """Claim a new, released or expired connection for the session valid until `valid_until`."""
        now = now_ms()
        values = {
            ":started": {"S": STARTED},
            ":now_minus_skew": {"N": str(now - self._settings.max_clock_skew_ms)},
        }
        return await self._claim(
            connection_id, me, update=_CLAIM, condition=COND_ACQUIRE, values=values, valid_until=valid_until
        )

    async def claim_from_dead(
        self,
        connection_id: str,
        me: str,
        *,
        dead: str,
        epoch: int,
        resume_seq: int,
        valid_until: float,
        confirmed: bool = False,
        expires_at_ms: int = SESSION_HELD,
        resume_cursor: str | None = None,
    ) -> AcquireResult:
        """Take over `dead`'s connection at `epoch`, resuming after max(last_seq, resume_seq).

        Call only after `dead`'s session is fenced (fences are never undone). A connection-mode
        worker passes its own lease expiry as `expires_at_ms`.
        """
        condition = COND_FROM_DEAD if confirmed else COND_FROM_DEAD_SESSION
        values: dict[str, Any] = {
            ":dead": {"S": dead},
            ":epoch": {"N": str(epoch)},
            ":started": {"S": STARTED},
        }
        if not confirmed:
            values[":held"] = {"N": str(SESSION_HELD)}
        if resume_seq > NO_CHECKPOINT:
            result = await self._claim(
                connection_id,
                me,
                update=_CLAIM_WITH_SEQ if resume_cursor is None else _CLAIM_WITH_SEQ_AND_CURSOR,
                condition=f"{condition} AND {COND_NOT_BEHIND}",
                values=values
                | {":resume": {"N": str(resume_seq)}}
                | ({} if resume_cursor is None else cursor_value(resume_cursor)),
                valid_until=valid_until,
                resume_seq=resume_seq,
                resume_cursor=resume_cursor,
                expires_at_ms=expires_at_ms,
            )
            if not (isinstance(result, Lost) and result.holder == dead and result.epoch == epoch):
                return result
            # Still dead's at that epoch: the item's checkpoint is already past resume_seq (or the
            # state/marker refused it, which the plain attempt below refuses again).
        return await self._claim(
            connection_id,
            me,
            update=_CLAIM,
            condition=condition,
            values=values,
            valid_until=valid_until,
            resume_seq=resume_seq,
            expires_at_ms=expires_at_ms,
        )

    async def owner_ids(self, worker: str) -> list[str]:
        return await self._reads.owner_ids(worker)

    async def owned_by(self, worker: str) -> list[OwnedConnection]:
        return await self._reads.owned_by(worker)

    async def free_for(
        self, connection: OwnedConnection, *, dead: str, resume_seq: int, resume_cursor: str | None = None
    ) -> bool:
        """Free a fenced session's connection that nobody will claim (it is STOPPED), keeping the
        dead holder's newer checkpoint: `last_seq = max(item's, resume_seq)`, as a claim from
        the dead does, so the effective checkpoint never moves back (review 2026-12-05, C1).
        False if `dead` no longer holds it at that epoch and expiry (as read)."""
        values: dict[str, Any] = {
            ":dead": {"S": dead},
            ":epoch": {"N": str(connection.epoch)},
            ":expires": {"N": str(connection.expires_at_ms)},
            ":zero": {"N": "0"},
            ":now": {"N": str(now_ms())},
        }
        attempts = [(_FREE, COND_DEAD_HOLDS_AS_READ, values)]
        if resume_seq > connection.last_seq:
            with_seq = values | {":resume": {"N": str(resume_seq)}}
            update = _FREE_WITH_SEQ
            if resume_cursor is not None:  # the entry's cursor goes with its seq
                with_seq |= cursor_value(resume_cursor)
                update = _FREE_WITH_SEQ_AND_CURSOR
            attempts.insert(0, (update, f"{COND_DEAD_HOLDS_AS_READ} AND {COND_NOT_BEHIND}", with_seq))
        for update, condition, attempt_values in attempts:
            try:
                await call_with_deadline(
                    self._client.update_item(
                        TableName=self._table,
                        Key={"connection_id": {"S": connection.connection_id}},
                        UpdateExpression=update,
                        ConditionExpression=condition,
                        ExpressionAttributeValues=attempt_values,
                        ReturnValuesOnConditionCheckFailure="ALL_OLD",
                        **cursor_names(update),
                    ),
                    self._call_timeout,
                )
                return True
            except ClientError as error:
                old = failed_item(error)
                if (
                    text(old, "lease_owner") != dead
                    or number(old, "lease_epoch") != connection.epoch
                    or number(old, "lease_expires_at_ms") != connection.expires_at_ms
                ):
                    return False
                # Still dead's at that epoch: the item is already past resume_seq; free it as is.
        return False

    async def release(self, lease: Lease, last_seq: int | None, cursor: str | None = None) -> bool:
        return await self._leases.release(lease, last_seq, cursor)

    async def mark_failed(
        self, lease: Lease, reason: str, last_seq: int | None = None, cursor: str | None = None
    ) -> bool:
        return await self._leases.mark_failed(lease, reason, last_seq, cursor)

    async def record_failure(self, lease: Lease, reason: str) -> bool:
        return await self._leases.record_failure(lease, reason)

    async def _claim(
        self,
        connection_id: str,
        me: str,
        *,
        update: str,
        condition: str,
        values: dict[str, Any],
        valid_until: float,
        resume_seq: int = NO_CHECKPOINT,
        resume_cursor: str | None = None,
        expires_at_ms: int = SESSION_HELD,
    ) -> AcquireResult:
        sent_at = monotonic()
        try:
            response = await call_with_deadline(
                self._client.update_item(
                    TableName=self._table,
                    Key={"connection_id": {"S": connection_id}},
                    UpdateExpression=update,
                    ConditionExpression=condition,
                    ExpressionAttributeValues=values
                    | {
                        ":me": {"S": me},
                        ":expires": {"N": str(expires_at_ms)},
                        ":now": {"N": str(now_ms())},
                        ":one": {"N": "1"},
                    },
                    ReturnValues="ALL_OLD",
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                    **cursor_names(update),
                ),
                self._call_timeout,
            )
        except ClientError as error:
            lost = _lost(failed_item(error))
            if lost.holder == me:
                # Our own write, applied by an earlier attempt whose reply was lost (the SDK
                # retried): not a race we lost. The caller reads it back (review 2026-12-05, A, I).
                raise AcquireUncertain(
                    lost.reason, connection_id=connection_id, sent_at=sent_at, expires_at_ms=expires_at_ms
                ) from None
            return lost
        except (StoreUnavailable, StoreThrottled) as error:
            # Timed out, or a retry throttled after an attempt that may have landed: DynamoDB may
            # have applied it. Never "failed": an applied claim names our session, which does not
            # expire, so it must be read back and adopted or released.
            raise AcquireUncertain(
                str(error), connection_id=connection_id, sent_at=sent_at, expires_at_ms=expires_at_ms
            ) from error
        old = response.get("Attributes", {})
        lease = Lease(
            connection_id=connection_id,
            epoch=number(old, "lease_epoch") + 1,
            owner=me,
            ws_url="",
            start_seq=NO_CHECKPOINT,
            valid_until=valid_until,
        )
        try:
            previous = ConnectionItem.from_attributes(old)
        except MalformedItem as problem:
            await self._leases.mark_failed(lease, str(problem))
            return Malformed(connection_id, str(problem))
        if resume_seq > previous.last_seq or (resume_seq == previous.last_seq and resume_cursor is not None):
            lease.resume_from(previous, resume_seq, resume_cursor)  # the dead holder's entry, and its cursor
        else:
            lease.resume_from(previous, previous.last_seq, previous.cursor)
        return Acquired(lease, previous)


def _lost(old: dict[str, Any]) -> Lost:
    if not old:
        return Lost(None, None, "not claimable: no such connection")
    holder = text(old, "lease_owner")
    epoch = number(old, "lease_epoch") if "lease_epoch" in old else None
    detail = f"held by {holder} at epoch {epoch}" if holder else f"desired_state {text(old, 'desired_state')}"
    return Lost(holder, epoch, f"not claimable: {detail}")
