"""Session items (`worker#<id>`, docs/design.md §2.0): heartbeat, list, fence, withdraw, reap.

Correctness model (session mode, docs/design.md §2.0, §2b, §2d)
---------------------------------------------------------
- Death is never judged by a wall clock. A holder H counts its session valid until
  `s + LEASE_SECONDS - margin`, where `s` is its monotonic clock when it SENT its last
  heartbeat that succeeded (liveness.SessionValidity). An observer O fences H only after H's
  counter kept one value `v` for LEASE_SECONDS on O's monotonic clock since O first saw `v`
  (liveness.Observer), and only with `hb = v AND attribute_not_exists(fenced_by)`.
- Why that is safe. DynamoDB conditional writes are linearizable per item. If O's fence commits
  at real time f, no heartbeat of H committed between O's first sight of `v` and f (it would
  have changed hb). The heartbeat that wrote `v` was sent before it committed, which was before
  O read it, which was before O's first sight t0; so H's deadline lies before
  t0 + LEASE_SECONDS - margin <= f - margin. Every later heartbeat of H fails on the fence
  (a zombie learns it at once and stops), so H's deadline never moves past f again.
  H has therefore stopped delivering, on its own clock, at least `margin` before anyone can
  claim its session-held connections. The clocks' offsets never enter; what is assumed is that
  both monotonic clocks advance at the rate of real time (drift far below margin) and that H
  checks validity right before each delivery (§2d). Stale (eventually consistent) reads only
  delay a verdict: the fence itself is the consistent check.
- A confirmed fence (the supervisor after waitpid, §2e) needs no counter: the process is dead.
- Not guaranteed: a holder whose monotonic clock stops while real time runs (system suspend:
  CLOCK_MONOTONIC excludes it on Linux), or a worker id reused by two live processes at once.
- Heartbeats never recreate a session item that disappeared: only the first heartbeat of this
  store creates it. A reaped (fenced, then deleted) session cannot come back as a zombie.
- Withdrawal marks the item (`withdrawn_at_ms`) rather than deleting it: peers stop counting the
  worker for fair share at once, but its connections stay held by it until it releases them (a
  withdrawal is not a fence). If it dies before releasing them all, its counter stops and
  observers fence it as usual, so nothing is stranded. `reap` deletes fenced items later.

Cost: a heartbeat writes one small item and never an index key (the GSI keys `desired_state`
and `lease_expires_at_ms = 0` are written by the first heartbeat only). `list_sessions` is one
KEYS_ONLY query of the WORKER partition of `by-state-expiry` plus one BatchGetItem per 100
sessions: O(workers) reads, independent of the number of connections.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import ClientError

from leaseworker.lease.attribute_values import (
    checkpoint_key,
    error_code,
    failed_item,
    number,
    optional_number,
    purge_at,
    session_key,
    text,
)
from leaseworker.lease.batch_get import batch_get_items
from leaseworker.lease.checkpoint_store import CheckpointStore
from leaseworker.lease.dynamodb import CONDITION_FAILED, call_with_deadline, now_ms
from leaseworker.lease.errors import StoreError
from leaseworker.lease.liveness import CONFIRMED, SUSPECTED, SessionInfo
from leaseworker.lease.vocabulary import INDEX_BY_STATE_EXPIRY, WORKER_KEY_PREFIX, WORKER_STATE

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb import DynamoDBClient

__all__ = ["Fenced", "HeartbeatResult", "SessionInfo", "SessionStore"]

log = logging.getLogger(__name__)
T = TypeVar("T")


COND_NOT_FENCED = "attribute_not_exists(fenced_by)"
COND_LIVE_SESSION = f"attribute_exists(connection_id) AND {COND_NOT_FENCED}"
COND_FENCE_OBSERVED = f"hb = :seen AND {COND_NOT_FENCED}"
COND_FENCE_CONFIRMED = COND_LIVE_SESSION
COND_FENCED = "attribute_exists(fenced_by)"


@dataclass(frozen=True, slots=True)
class Fenced:
    """The heartbeat was refused: stop at once. `kind` is suspected, confirmed or vanished."""

    fenced_by: str | None
    kind: str
    reason: str


HeartbeatResult = int | Fenced
VANISHED = "vanished"


class SessionStore:
    def __init__(self, client: DynamoDBClient, table_name: str, *, call_timeout: float = 5.0) -> None:
        self._client = client
        self._table = table_name
        self._call_timeout = call_timeout
        self._created: set[str] = set()
        self._checkpoints = CheckpointStore(client, table_name, call_timeout=call_timeout)

    async def heartbeat(
        self,
        me: str,
        *,
        load: int,
        capacity: int,
        lease_mode: str,
        task_arn: str | None = None,
        timeout: float | None = None,
    ) -> HeartbeatResult:
        """Increment `hb` unless fenced; the new counter, or why we are fenced.

        The caller sets `timeout` no later than its session's local validity (a heartbeat that
        lands later could not extend anything it may rely on).
        """
        now = now_ms()
        values: dict[str, Any] = {
            ":one": {"N": "1"},
            ":load": {"N": str(load)},
            ":purge": {"N": str(purge_at(now))},
            ":now": {"N": str(now)},
        }
        update = "SET #load = :load, purge_at = :purge, updated_at_ms = :now"
        names = {"#load": "load"}
        first = me not in self._created
        if first:
            update += (
                ", desired_state = :state, lease_expires_at_ms = :zero, #capacity = :cap, lease_mode = :mode"
            )
            names["#capacity"] = "capacity"
            values |= {
                ":state": {"S": WORKER_STATE},
                ":zero": {"N": "0"},
                ":cap": {"N": str(capacity)},
                ":mode": {"S": lease_mode},
            }
            if task_arn:
                update += ", task_arn = :arn"
                values[":arn"] = {"S": task_arn}
        try:
            response = await self._call(
                self._client.update_item(
                    TableName=self._table,
                    Key=session_key(me),
                    UpdateExpression=f"{update} ADD hb :one",
                    ConditionExpression=COND_NOT_FENCED if first else COND_LIVE_SESSION,
                    ExpressionAttributeNames=names,
                    ExpressionAttributeValues=values,
                    ReturnValues="UPDATED_NEW",
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                ),
                timeout,
            )
        except ClientError as error:
            old = failed_item(error)
            if not old:
                return Fenced(None, VANISHED, "session item no longer exists")
            return Fenced(
                text(old, "fenced_by"), text(old, "fence_kind") or SUSPECTED, text(old, "fence_reason") or ""
            )
        self._created.add(me)
        return number(response.get("Attributes", {}), "hb")

    async def list_sessions(self, *, consistent: bool = False) -> list[SessionInfo]:
        """Every session item: one index query plus ceil(workers / 100) BatchGetItem calls."""
        keys = await self._session_keys()
        items = await batch_get_items(
            self._client, self._table, keys, timeout=self._call_timeout, consistent=consistent
        )
        return sorted((_session_from(item) for item in items), key=lambda s: s.worker_id)

    async def get(self, worker_id: str) -> SessionInfo | None:
        response = await self._call(
            self._client.get_item(TableName=self._table, Key=session_key(worker_id), ConsistentRead=True)
        )
        item = response.get("Item")
        return _session_from(item) if item else None

    async def fence(self, peer: str, *, seen_hb: int | None, me: str, kind: str, reason: str) -> bool:
        """Fence `peer`'s session; False if it was alive (hb moved), already fenced, or gone.

        An observer passes kind=SUSPECTED and the counter value it saw still; the supervisor
        passes kind=CONFIRMED and may pass seen_hb=None (it watched the process exit).
        """
        if kind not in (SUSPECTED, CONFIRMED):
            raise ValueError(f"fence kind must be {SUSPECTED} or {CONFIRMED}, got {kind!r}")
        if seen_hb is None and kind != CONFIRMED:
            raise ValueError("only a confirmed fence may skip the counter check")
        values = _fence_values(me, kind, reason)
        condition = COND_FENCE_CONFIRMED
        if seen_hb is not None:
            condition = COND_FENCE_OBSERVED
            values[":seen"] = {"N": str(seen_hb)}
        if not await self._conditional(
            session_key(peer),
            "SET fenced_by = :by, fence_kind = :kind, fence_reason = :reason, fenced_at_ms = :now",
            condition,
            values,
        ):
            return False
        try:
            # Best effort: the claim trusts a checkpoint entry only at the connection item's own
            # epoch, and a zombie's late entry is never ahead of what its sink accepted.
            await self._checkpoints.fence(peer, by=me, kind=kind)
        except StoreError as error:
            log.warning("fenced %s but not its checkpoint item: %s", peer, error)
        return True

    async def withdraw(self, me: str) -> bool:
        """Announce a graceful exit: peers stop counting us. False if we are fenced or gone."""
        return await self._conditional(
            session_key(me), "SET withdrawn_at_ms = :now", COND_LIVE_SESSION, {":now": {"N": str(now_ms())}}
        )

    async def reap(self, peer: str) -> bool:
        """Delete a fenced session and its checkpoint item, once nothing is held by it any more."""
        try:
            await self._call(
                self._client.delete_item(
                    TableName=self._table, Key=session_key(peer), ConditionExpression=COND_FENCED
                )
            )
        except ClientError as error:
            if error_code(error) == CONDITION_FAILED:
                return False
            raise
        await self._call(self._client.delete_item(TableName=self._table, Key=checkpoint_key(peer)))
        return True

    # ------------------------------------------------------------------ plumbing

    async def _session_keys(self) -> list[dict[str, Any]]:
        keys: list[dict[str, Any]] = []
        start_key: dict[str, Any] | None = None
        while True:
            kwargs: dict[str, Any] = {
                "TableName": self._table,
                "IndexName": INDEX_BY_STATE_EXPIRY,
                "KeyConditionExpression": "desired_state = :worker",
                "ExpressionAttributeValues": {":worker": {"S": WORKER_STATE}},
                "ProjectionExpression": "connection_id",
            }
            if start_key:
                kwargs["ExclusiveStartKey"] = start_key
            response = await self._call(self._client.query(**kwargs))
            keys.extend({"connection_id": item["connection_id"]} for item in response.get("Items", []))
            start_key = response.get("LastEvaluatedKey")
            if not start_key:
                return keys

    async def _conditional(
        self, key: dict[str, Any], update: str, condition: str, values: dict[str, Any]
    ) -> bool:
        try:
            await self._call(
                self._client.update_item(
                    TableName=self._table,
                    Key=key,
                    UpdateExpression=update,
                    ConditionExpression=condition,
                    ExpressionAttributeValues=values,
                )
            )
        except ClientError as error:
            if error_code(error) == CONDITION_FAILED:
                return False
            raise
        return True

    async def _call(self, awaitable: Awaitable[T], timeout: float | None = None) -> T:
        return await call_with_deadline(awaitable, self._call_timeout if timeout is None else timeout)


def _fence_values(me: str, kind: str, reason: str) -> dict[str, Any]:
    return {
        ":by": {"S": me},
        ":kind": {"S": kind},
        ":reason": {"S": reason[:500] or "unspecified"},
        ":now": {"N": str(now_ms())},
    }


def _session_from(item: dict[str, Any]) -> SessionInfo:
    key = text(item, "connection_id") or ""
    return SessionInfo(
        worker_id=key.removeprefix(WORKER_KEY_PREFIX),
        hb=number(item, "hb"),
        load=number(item, "load"),
        capacity=number(item, "capacity"),
        lease_mode=text(item, "lease_mode") or "",
        task_arn=text(item, "task_arn"),
        updated_at_ms=number(item, "updated_at_ms"),
        withdrawn="withdrawn_at_ms" in item,
        fenced_by=text(item, "fenced_by"),
        fence_kind=text(item, "fence_kind"),
        fence_reason=text(item, "fence_reason"),
        fenced_at_ms=optional_number(item, "fenced_at_ms"),
    )
