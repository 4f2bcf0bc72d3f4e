"""The confirmed fence (docs/design.md §2e): what the supervisor writes once waitpid saw its child die.

1. Fence the child's session item `worker#<id>` as a confirmed death. Peers treat
   `fence_kind = confirmed` as "everything it held is claimable now"; its heartbeat, were it
   somehow alive, would fail on `attribute_not_exists(fenced_by)`.
2. Best effort, the same on its checkpoint item `worker#<id>#ckpt`.
3. Find the connections it held through the sparse GSI `by-owner` and send one
   `connection_changed` hint for each, so that peers claim them now instead of at their next
   reconcile.

A lost condition is a normal outcome: the item is already fenced (an observer got there first)
or was never written (the child died before its first heartbeat). The whole path runs under
one deadline (`run_fast_path`): the supervisor exits with the child's status however it went.

Imported only when a fence is needed (or to preload the clients): it pulls in botocore.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from leaseworker.lease.vocabulary import CHECKPOINT_KEY_SUFFIX, INDEX_BY_OWNER, WORKER_KEY_PREFIX
from leaseworker.settings import Settings, load_settings

if TYPE_CHECKING:
    from botocore.config import Config

FENCE_KIND_CONFIRMED = "confirmed"
FENCE_CONFIRMED_UPDATE = "SET fenced_by = :by, fence_kind = :kind, fence_reason = :why, fenced_at_ms = :now"
# Not fenced yet (an observer's fence stands), and the item exists (never create one).
COND_CONFIRM_FENCE = "attribute_not_exists(fenced_by) AND attribute_exists(connection_id)"
OWNED_BY_KEY = "lease_owner = :owner"
HINT_MESSAGE_TYPE = "connection_changed"  # the same wire form as leaseworker.notify
HINT_BATCH_SIZE = 10  # the SendMessageBatch maximum
HINT_SENDERS = 8  # batches in flight at once: 1000 connections are 100 batches
# The whole fast path: past it the supervisor exits anyway (ECS then replaces the task).
FAST_PATH_BUDGET_SECONDS = 5.0
# One call: connect 0.5 s + read 1 s, two attempts at most, so ≤ 3 s even when nothing answers.
CONNECT_TIMEOUT_SECONDS = 0.5
READ_TIMEOUT_SECONDS = 1.0
MAX_ATTEMPTS = 2

FENCED = "fenced"
LOST = "condition lost (already fenced, or never written)"
NOT_ATTEMPTED = "not attempted"


class DynamoDBCalls(Protocol):
    def update_item(self, **kwargs: Any) -> Mapping[str, Any]: ...
    def query(self, **kwargs: Any) -> Mapping[str, Any]: ...


class SQSCalls(Protocol):
    def send_message_batch(self, **kwargs: Any) -> Mapping[str, Any]: ...


@dataclass(frozen=True, slots=True)
class FenceTarget:
    """Whose session to fence, where: the same settings the child was started with."""

    worker_id: str
    table: str
    endpoint_url: str | None
    region: str | None
    queue_url: str | None

    @classmethod
    def from_settings(cls, settings: Settings) -> FenceTarget:
        return cls(
            worker_id=settings.worker_id,
            table=settings.table_name,
            endpoint_url=settings.endpoint_url,
            region=settings.region,
            queue_url=settings.notify_queue_url,
        )

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> FenceTarget:
        return cls.from_settings(load_settings(env))

    @property
    def fenced_by(self) -> str:
        return f"supervisor:{self.worker_id}"


@dataclass(frozen=True, slots=True)
class FenceClients:
    dynamodb: DynamoDBCalls
    sqs: SQSCalls | None


@dataclass
class FenceReport:
    """What the fast path did; filled in as it goes, so a timed-out run still says how far it got."""

    session: str = NOT_ATTEMPTED
    checkpoint: str = NOT_ATTEMPTED
    owned: int = 0
    hinted: int = 0
    errors: list[str] = field(default_factory=list)
    # Milliseconds since the exit was observed, per step: fenced, hinted, done.
    marks_ms: dict[str, int] = field(default_factory=dict)
    finished: bool = False


def open_clients(target: FenceTarget) -> FenceClients:
    """Plain (blocking) botocore clients with short, bounded calls; SQS only with a queue."""
    import botocore.session
    from botocore.config import Config

    session = botocore.session.get_session()
    config: Config = Config(
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
        read_timeout=READ_TIMEOUT_SECONDS,
        retries={"total_max_attempts": MAX_ATTEMPTS, "mode": "standard"},
        max_pool_connections=HINT_SENDERS + 2,
    )
    dynamodb = session.create_client(
        "dynamodb", endpoint_url=target.endpoint_url, region_name=target.region, config=config
    )
    sqs = None
    if target.queue_url:
        # No endpoint here: botocore resolves AWS_ENDPOINT_URL_SQS / AWS_ENDPOINT_URL itself.
        sqs = session.create_client("sqs", region_name=target.region, config=config)
    return FenceClients(dynamodb=cast(DynamoDBCalls, dynamodb), sqs=cast(SQSCalls | None, sqs))


def run_fast_path(
    target: FenceTarget,
    reason: str,
    *,
    observed_at: float,
    clients: FenceClients | None = None,
    budget_seconds: float = FAST_PATH_BUDGET_SECONDS,
) -> FenceReport:
    """Fence and hint within `budget_seconds` of `observed_at` (time.monotonic() of the waitpid).

    Runs in a daemon thread so the deadline holds even if a call hangs; the caller exits anyway."""
    report = FenceReport()

    def work() -> None:
        try:
            fence_and_hint(clients or open_clients(target), target, reason, report, observed_at)
        except Exception as error:  # reported by the caller, which exits with the child's status
            report.errors.append(f"{type(error).__name__}: {error}")
        finally:
            report.marks_ms["done"] = _since(observed_at)

    thread = threading.Thread(target=work, name="confirmed-fence", daemon=True)
    thread.start()
    thread.join(max(0.0, observed_at + budget_seconds - time.monotonic()))
    report.finished = not thread.is_alive()
    return report


def fence_and_hint(
    clients: FenceClients, target: FenceTarget, reason: str, report: FenceReport, observed_at: float
) -> None:
    values = {
        ":by": {"S": target.fenced_by},
        ":kind": {"S": FENCE_KIND_CONFIRMED},
        ":why": {"S": reason},
        ":now": {"N": str(int(time.time() * 1000))},
    }
    session_key = f"{WORKER_KEY_PREFIX}{target.worker_id}"
    try:
        report.session = fence_item(clients.dynamodb, target.table, session_key, values)
    except Exception as error:
        report.session = f"error: {type(error).__name__}"
        raise
    report.marks_ms["fenced"] = _since(observed_at)
    try:
        report.checkpoint = fence_item(
            clients.dynamodb, target.table, session_key + CHECKPOINT_KEY_SUFFIX, values
        )
    except Exception as error:  # best effort: the session fence is what peers act on
        report.checkpoint = f"error: {type(error).__name__}: {error}"
    owned = owned_connections(clients.dynamodb, target.table, target.worker_id)
    report.owned = len(owned)
    if clients.sqs is not None and target.queue_url and owned:
        report.hinted = send_hints(clients.sqs, target.queue_url, owned, report.errors)
        report.marks_ms["hinted"] = _since(observed_at)


def fence_item(dynamodb: DynamoDBCalls, table: str, key: str, values: Mapping[str, Any]) -> str:
    """FENCED, or LOST when the condition failed; any other failure raises."""
    from botocore.exceptions import ClientError

    try:
        dynamodb.update_item(
            TableName=table,
            Key={"connection_id": {"S": key}},
            UpdateExpression=FENCE_CONFIRMED_UPDATE,
            ConditionExpression=COND_CONFIRM_FENCE,
            ExpressionAttributeValues=values,
        )
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            return LOST
        raise
    return FENCED


def owned_connections(dynamodb: DynamoDBCalls, table: str, owner: str) -> list[str]:
    """Every connection id whose `lease_owner` is `owner`, through the KEYS_ONLY `by-owner` GSI."""
    found: list[str] = []
    start: Mapping[str, Any] | None = None
    while True:
        request: dict[str, Any] = {
            "TableName": table,
            "IndexName": INDEX_BY_OWNER,
            "KeyConditionExpression": OWNED_BY_KEY,
            "ExpressionAttributeValues": {":owner": {"S": owner}},
        }
        if start:
            request["ExclusiveStartKey"] = start
        page = dynamodb.query(**request)
        for item in page.get("Items", []):
            connection_id = item["connection_id"]["S"]
            if not connection_id.startswith(WORKER_KEY_PREFIX):
                found.append(connection_id)
        start = page.get("LastEvaluatedKey")
        if not start:
            return found


def encode_hint(connection_id: str) -> str:
    """`{"type":"connection_changed","connection_id":ID}`, byte for byte leaseworker.notify's."""
    return json.dumps({"type": HINT_MESSAGE_TYPE, "connection_id": connection_id}, separators=(",", ":"))


def send_hints(sqs: SQSCalls, queue_url: str, connection_ids: Sequence[str], errors: list[str]) -> int:
    """Send one hint per connection in batches of 10; returns how many connections got at least
    one hint accepted. Failures go to `errors`: a hint is only a fast path (docs/design.md §6).

    The dead child's own long poll (ReceiveMessage, up to 20 s, 10 messages) may still be open
    at SQS: it would take the first hints that land and hide them for the queue's visibility
    timeout, answering a socket nobody reads. So the first batch goes alone, as the one such a
    poll can take, then the rest, several batches at once, and that first batch again."""
    batches = list(_batches(connection_ids, HINT_BATCH_SIZE))
    if not batches:
        return 0

    def send(batch: Sequence[str]) -> set[str]:
        entries = [{"Id": str(i), "MessageBody": encode_hint(cid)} for i, cid in enumerate(batch)]
        try:
            response = sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
        except Exception as error:
            errors.append(f"hints for {len(batch)} connections: {type(error).__name__}: {error}")
            return set()
        failed = response.get("Failed", [])
        if failed:
            errors.append(f"{len(failed)} hints refused: {failed[0].get('Message', failed[0])}")
        return {batch[int(entry["Id"])] for entry in response.get("Successful", [])}

    hinted = send(batches[0])
    with ThreadPoolExecutor(max_workers=HINT_SENDERS, thread_name_prefix="hint") as pool:
        for accepted in pool.map(send, [*batches[1:], batches[0]]):
            hinted |= accepted
    return len(hinted)


def _batches(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _since(observed_at: float) -> int:
    return int((time.monotonic() - observed_at) * 1000)
