"""The fleet's connect budget per upstream host (`budget#<host>`, docs/design.md §2, §4.2).

An upstream counts connects per client address over a sliding window: at most `count` in any
`seconds`. The fleet leaves through a few NAT addresses, so the budget is one item per host key,
shared by every worker, and taken with conditional writes.

The item keeps a log of grants: `[expires_at_ms, tokens]` pairs, merged per 1/STEPS of the window
(expiries rounded up) so that the item stays under 1 KB. A worker takes a few tokens at
once (its local cache, worker/budget.py) and must use them within `HOLD_MS`; a grant counts
against the window until `granted + HOLD_MS + SLACK_MS + seconds`, so every connect made with
its tokens lies inside a window that still counts them: in any window of `seconds`, at most
`count` connects, as the upstream counts them (no burst on top of a refill, unlike a plain
token bucket). A connect whose upgrade is not sent within SEND_BY_MS of its grant (a slow
write's reply, a busy loop) is abandoned before it is sent and takes another token. Expired
grants are dropped at each write.

Each write is conditional on the `version` the writer read, so two takers never both spend the
same free tokens (a lost race re-reads the item from the failed condition's ALL_OLD and tries
again). A refusal from the upstream (HTTP 429, a 418 ban) writes `backoff_until_ms` into the
item, which also bumps `version`: a peer's take based on an older read fails and sees it.
`urgent_until_ms`: a taker for a takeover or handoff marks that it waits; a fresh cold start
takes nothing until it lapses (priority across the fleet).

Clocks: grant times are the taker's wall clock. A worker whose clock runs behind its peers' by d
makes its grants lapse d late (safe); one ahead by d lets them lapse d early, allowing up to the
tokens of the grants it overlaps in a window. SLACK_MS absorbs NTP-level offsets (milliseconds).

Cost: one conditional PutItem per take (item < 1 KB: 1 WRU), plus one strongly consistent
GetItem (1 RCU) when the worker has no fresh copy of the item; docs/tuning.md has the figures.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import urlsplit

from botocore.exceptions import ClientError

from leaseworker.clock import wall_ns
from leaseworker.lease.attribute_values import failed_item, purge_at
from leaseworker.lease.dynamodb import CONDITION_FAILED, call_with_deadline
from leaseworker.lease.vocabulary import BUDGET_KEY_PREFIX, TTL_ATTRIBUTE

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb import DynamoDBClient

T = TypeVar("T")

HOLD_MS: Final = 500  # a cached token unused this long after its grant is dropped
# Connect latency (the upgrade reaches the upstream after the take) and clocks. 1 s was too
# little on a loaded 2-core host: 100 connects granted at once reached the upstream over more
# than a second, and it refused the tail (429, then a 418 ban).
SLACK_MS: Final = 2_000
# A connect's upgrade is sent this soon after its grant, or not at all (worker/upstream.py
# TokenLapsed): a quarter of the slack is left for the network and the upstream's own reading.
SEND_BY_MS: Final = HOLD_MS + SLACK_MS * 3 // 4
STEPS: Final = 32  # the grant log's resolution: at most this many entries per window (item size)
MAX_RACES: Final = 8  # lost conditions in one take before it reports "try again shortly"


def budget_key(host: str) -> dict[str, Any]:
    return {"connection_id": {"S": f"{BUDGET_KEY_PREFIX}{host}"[:1024]}}


def now_ms() -> int:
    return wall_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Take:
    """The outcome of one take: `tokens` granted (0..wanted); if none, `retry_at_ms` is the
    wall-clock time at which trying again may succeed, and `why` says what holds it."""

    tokens: int
    retry_at_ms: int = 0
    why: str = ""
    write_units: float = 0.0  # consumed by this take (ReturnConsumedCapacity), for the cost figures
    read_units: float = 0.0
    granted_at_ms: int = 0  # the taker's wall clock that the grant's expiry counts from


@dataclass(slots=True)
class _Seen:
    version: int
    grants: list[tuple[int, int]]
    backoff_until_ms: int
    backoff_reason: str
    urgent_until_ms: int


def _parse(item: dict[str, Any]) -> _Seen:
    if not item:
        return _Seen(0, [], 0, "", 0)
    grants = [(int(g["L"][0]["N"]), int(g["L"][1]["N"])) for g in item.get("grants", {}).get("L", [])]
    return _Seen(
        version=int(item.get("version", {}).get("N", "0")),
        grants=grants,
        backoff_until_ms=int(item.get("backoff_until_ms", {}).get("N", "0")),
        backoff_reason=str(item.get("backoff_reason", {}).get("S", "")),
        urgent_until_ms=int(item.get("urgent_until_ms", {}).get("N", "0")),
    )


def _units(response: Any) -> float:
    consumed = response.get("ConsumedCapacity") if isinstance(response, dict) else None
    return float(consumed.get("CapacityUnits", 0.0)) if isinstance(consumed, dict) else 0.0


class BudgetStore:
    """Takes tokens from, and writes back-offs into, the `budget#<host>` items of one table."""

    def __init__(self, client: DynamoDBClient, table: str, *, call_timeout: float = 2.0) -> None:
        self._client = client
        self._table = table
        self._call_timeout = call_timeout
        self._seen: dict[str, _Seen] = {}  # the last copy of each host's item we read or wrote

    async def _call(self, awaitable: Awaitable[T]) -> T:
        return await call_with_deadline(awaitable, self._call_timeout)

    async def _read(self, host: str) -> tuple[_Seen, float]:
        response = await self._call(
            self._client.get_item(
                TableName=self._table,
                Key=budget_key(host),
                ConsistentRead=True,
                ReturnConsumedCapacity="TOTAL",
            )
        )
        seen = _parse(dict(response.get("Item", {})))
        self._seen[host] = seen
        return seen, _units(response)

    async def take(
        self, host: str, wanted: int, *, count: int, seconds: float, urgent: bool, fresh: bool = False
    ) -> Take:
        """Take up to `wanted` tokens for connects to `host` (at most `count` per `seconds`).
        `urgent`: for a takeover or a handoff (cold starts yield to it). `fresh`: read the item
        first rather than trust the last copy (after a wait, when peers have surely written)."""
        reads = writes = 0.0
        seen = None if fresh else self._seen.get(host)
        if seen is None:
            seen, reads = await self._read(host)
        for _ in range(MAX_RACES):
            now = now_ms()
            if seen.backoff_until_ms > now:
                return Take(0, seen.backoff_until_ms, f"backed off: {seen.backoff_reason}", writes, reads)
            if not urgent and seen.urgent_until_ms > now:
                return Take(0, seen.urgent_until_ms, "yielding to takeovers", writes, reads)
            live = sorted(g for g in seen.grants if g[0] > now)
            free = count - sum(tokens for _, tokens in live)
            if free <= 0:
                return Take(0, _first_free_at(live, count, now), "budget spent", writes, reads)
            tokens = min(wanted, free)
            grants = _with_grant(live, now + HOLD_MS + SLACK_MS + int(seconds * 1000), tokens, seconds)
            urgent_until = max(seen.urgent_until_ms, now + 2 * HOLD_MS) if urgent else seen.urgent_until_ms
            item: dict[str, Any] = budget_key(host) | {
                "version": {"N": str(seen.version + 1)},
                "grants": {"L": [{"L": [{"N": str(e)}, {"N": str(t)}]} for e, t in grants]},
                "count": {"N": str(count)},
                "seconds": {"N": repr(float(seconds))},
                "backoff_until_ms": {"N": str(seen.backoff_until_ms)},
                "backoff_reason": {"S": seen.backoff_reason or "-"},
                "urgent_until_ms": {"N": str(urgent_until)},
                "updated_at_ms": {"N": str(now)},
                TTL_ATTRIBUTE: {"N": str(purge_at(now))},
            }
            condition = "attribute_not_exists(connection_id)" if seen.version == 0 else "version = :v"
            extra: dict[str, Any] = (
                {"ExpressionAttributeValues": {":v": {"N": str(seen.version)}}} if seen.version else {}
            )
            try:
                response = await self._call(
                    self._client.put_item(
                        TableName=self._table,
                        Item=item,
                        ConditionExpression=condition,
                        ReturnValuesOnConditionCheckFailure="ALL_OLD",
                        ReturnConsumedCapacity="TOTAL",
                        **extra,
                    )
                )
            except ClientError as error:
                if error.response.get("Error", {}).get("Code") != CONDITION_FAILED:
                    raise
                writes += 1.0  # a failed condition is billed as a write
                seen = _parse(failed_item(error))
                self._seen[host] = seen
                continue
            writes += _units(response)
            self._seen[host] = _Seen(
                seen.version + 1, grants, seen.backoff_until_ms, seen.backoff_reason, urgent_until
            )
            return Take(tokens, 0, "", writes, reads, granted_at_ms=now)
        return Take(0, now_ms() + 50, "contended", writes, reads)

    async def back_off(self, host: str, until_ms: int, reason: str) -> None:
        """Back the whole host off until `until_ms` (wall clock) for the fleet; a later back-off
        already written stays. Bumps `version`, so a take based on an older read sees it."""
        try:
            await self._call(
                self._client.update_item(
                    TableName=self._table,
                    Key=budget_key(host),
                    UpdateExpression=(
                        "SET backoff_until_ms = :until, backoff_reason = :why, updated_at_ms = :now, "
                        "purge_at = :purge, version = if_not_exists(version, :zero) + :one"
                    ),
                    ConditionExpression="attribute_not_exists(backoff_until_ms) OR backoff_until_ms < :until",
                    ExpressionAttributeValues={
                        ":until": {"N": str(until_ms)},
                        ":why": {"S": reason[:200] or "refused"},
                        ":now": {"N": str(now_ms())},
                        ":purge": {"N": str(purge_at(now_ms()))},
                        ":zero": {"N": "0"},
                        ":one": {"N": "1"},
                    },
                )
            )
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != CONDITION_FAILED:
                raise
        self._seen.pop(host, None)  # read it again before the next take


def _with_grant(
    live: list[tuple[int, int]], expires: int, tokens: int, seconds: float
) -> list[tuple[int, int]]:
    """The log with a new grant, its expiry rounded up to a step of 1/STEPS of the window and
    merged with a grant of the same step: at most about STEPS entries (an item under 1 KB, one
    write unit), at the price of tokens counted up to one step longer than needed."""
    step = max(1, (int(seconds * 1000) + HOLD_MS + SLACK_MS) // STEPS)
    expires = -(-expires // step) * step
    if live and live[-1][0] == expires:
        return [*live[:-1], (expires, live[-1][1] + tokens)]
    return [*live, (expires, tokens)]


def _first_free_at(live: list[tuple[int, int]], count: int, now: int) -> int:
    """When the first token frees up: the earliest expiry (the log is sorted by expiry)."""
    used = sum(tokens for _, tokens in live)
    for expires, tokens in live:
        used -= tokens
        if used < count:
            return expires
    return now + 50


def paced_seconds(connections: int, count: int, seconds: float) -> float:
    """How much later than without a budget the last of `connections` connects to one host can
    be made, all wanting a token at once with the window free: a batch of `count` at once, then
    one more per window, and a grant counts for its window plus the hold and the slack (L1's
    budget term, docs/tuning.md)."""
    if connections <= count:
        return 0.0
    counted = seconds + (HOLD_MS + SLACK_MS) / 1000  # how long a grant counts, and its rounding
    window = counted + counted / STEPS
    return (math.ceil(connections / count) - 1) * window


def host_key(url: str) -> str:
    """The default budget key: the URL's host and port, as the upstream counts per address."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "wss" else 80)
    return f"{(parts.hostname or '').lower()}:{port}"


def paced_term_s(connections: Iterable[tuple[str, str | None]]) -> float:
    """L1's budget term for losing these connections at once, given as (ws_url, protocol_config
    text): per budget host, `paced_seconds` of the connections that draw on it; the longest.
    Connections without a budget (seqfeed/1, or no `budget` key) add nothing."""
    lost: dict[tuple[str, int, float], int] = {}
    for url, config_text in connections:
        try:
            budget = json.loads(config_text).get("budget") if config_text else None
            if not isinstance(budget, dict):
                continue
            key = (str(budget.get("host") or host_key(url)), int(budget["count"]), float(budget["seconds"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # an invalid config never connects: it is marked failed, not paced
        lost[key] = lost.get(key, 0) + 1
    return max((paced_seconds(n, count, seconds) for (_, count, seconds), n in lost.items()), default=0.0)
