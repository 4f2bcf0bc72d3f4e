"""Owners of held connections whose session item no longer exists (review 2026-12-05, D).

A claim can land after its session was reaped: a worker paused with the request in flight past
fence, takeover and reap (longer than 3 L + H), or the reap ran on an index that did not list
the claim yet. The connection is then held by a session that no longer exists, which no
takeover, listing or `remove` would ever free. Two table operations repair it:

- `held_owners`: every owner the `by-owner` index lists (a KEYS_ONLY Scan: about 50 bytes an
  entry, 0.5 read unit per 4 KB; one worker of the fleet runs it every few lease periods);
- `fence_absent`: a fenced session stub (`fence_kind = absent`) for such an owner, written only
  if no session item exists (`attribute_not_exists`). Peers then take over what it holds as from
  any fenced session, after LEASE_SECONDS on their own clock (worker/absent_owners.py), and reap
  the stub once it holds nothing. A heartbeat of the owner, should it still run, fails on the
  fence, so it stops at once; a zombie's claim cannot revive it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from leaseworker.lease.attribute_values import error_code, purge_at, session_key
from leaseworker.lease.dynamodb import CONDITION_FAILED, call_with_deadline, now_ms
from leaseworker.lease.liveness import ABSENT
from leaseworker.lease.vocabulary import INDEX_BY_OWNER, TTL_ATTRIBUTE, WORKER_STATE

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb import DynamoDBClient

COND_NO_SESSION = "attribute_not_exists(connection_id)"


class AbsentOwnerStore:
    def __init__(self, client: DynamoDBClient, table_name: str, *, call_timeout: float = 5.0) -> None:
        self._client = client
        self._table = table_name
        self._call_timeout = call_timeout

    async def held_owners(self) -> set[str]:
        """Every `lease_owner` the by-owner index lists (eventually consistent, KEYS_ONLY)."""
        owners: set[str] = set()
        start_key: dict[str, Any] | None = None
        while True:
            kwargs: dict[str, Any] = {"TableName": self._table, "IndexName": INDEX_BY_OWNER}
            if start_key:
                kwargs["ExclusiveStartKey"] = start_key
            response = await call_with_deadline(self._client.scan(**kwargs), self._call_timeout)
            items = response.get("Items", [])
            owners.update(item["lease_owner"]["S"] for item in items if "lease_owner" in item)
            start_key = response.get("LastEvaluatedKey")
            if not start_key:
                return owners

    async def fence_absent(self, owner: str, *, me: str, reason: str) -> bool:
        """Write a fenced stub session for `owner`; False if a session item exists (nothing to do)."""
        now = now_ms()
        item: dict[str, Any] = session_key(owner) | {
            "desired_state": {"S": WORKER_STATE},
            "lease_expires_at_ms": {"N": "0"},
            "hb": {"N": "0"},
            "load": {"N": "0"},
            "capacity": {"N": "0"},
            "lease_mode": {"S": "session"},
            "updated_at_ms": {"N": str(now)},
            TTL_ATTRIBUTE: {"N": str(purge_at(now))},
            "fenced_by": {"S": me},
            "fence_kind": {"S": ABSENT},
            "fence_reason": {"S": reason[:500]},
            "fenced_at_ms": {"N": str(now)},
        }
        try:
            await call_with_deadline(
                self._client.put_item(TableName=self._table, Item=item, ConditionExpression=COND_NO_SESSION),
                self._call_timeout,
            )
        except ClientError as error:
            if error_code(error) == CONDITION_FAILED:
                return False
            raise
        return True
