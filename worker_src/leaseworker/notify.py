"""Change notifications over SQS (docs/design.md §6): a fast path, never a correctness mechanism.

After add/start/stop/release, the CLI and the workers send
`{"type":"connection_changed","connection_id":ID}` to NOTIFY_QUEUE_URL. A worker that receives
one re-examines that connection at once (acquire it if free, close and release it if STOPPED)
instead of waiting for the next reconcile.

A release by a worker that is leaving (shutdown, a claim that landed after shutdown began, a
lapsed lease handed back) adds `"reason":"handoff"`: that connection needs an owner now, and the
worker that reads the hint claims it even above its fair share (never above MAX_CONNECTIONS).
Fair shares come from the peers' published loads, which lag their claims by up to a heartbeat,
so during a handoff every survivor can count itself full at once; a plain hint then bounced
between them until a reconcile (seen: 1.8 s handoffs against L2's "about one second").
Rebalancing hands any excess back with plain hints, which are claimed only within a share, so a
hand-back never loops. Readers ignore a reason they do not know.

All workers long-poll one shared queue, so each message reaches exactly one worker, not all of
them; the rest learn of the change at their next reconcile (every RECONCILE_SECONDS). That is
acceptable because a notification is only a hint:
- nothing is lost if it is dropped, delayed, duplicated or consumed by the "wrong" worker;
- the lease table is the only source of truth, and reconcile is the backstop.

Hence the failure policy here: sending never raises and is bounded by a short timeout; receiving
deletes every message it gets (valid or not: a malformed one would only come back), logs and
drops malformed ones, and backs off on errors without ever ending the loop except on `stop`.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from leaseworker.observability.logging import get_logger
from leaseworker.settings import ID_PATTERN

if TYPE_CHECKING:
    from types_aiobotocore_sqs import SQSClient
    from types_aiobotocore_sqs.type_defs import DeleteMessageBatchRequestEntryTypeDef, MessageTypeDef

__all__ = ["HANDOFF", "MESSAGE_TYPE", "Hint", "Notifier", "encode_message", "notifications", "parse_message"]

log = get_logger(__name__)

MESSAGE_TYPE = "connection_changed"
HANDOFF = "handoff"  # the optional `reason` of a leaving worker's release
MAX_MESSAGES = 10  # the SQS ReceiveMessage / DeleteMessageBatch maximum
SENDERS = 8  # SendMessageBatch requests in flight at once (below the client's pool of 10)
BACKOFF_BASE_SECONDS = 0.5
BACKOFF_CAP_SECONDS = 20.0
# A long poll returns after WaitTimeSeconds; anything much longer is a hung connection.
RECEIVE_SLACK_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class Hint:
    connection_id: str
    handoff: bool = False  # released by a leaving worker: it needs an owner now


def encode_message(connection_id: str, *, handoff: bool = False) -> str:
    """The exact wire form: `{"type":"connection_changed","connection_id":ID}`, plus
    `"reason":"handoff"` for a leaving worker's release."""
    message = {"type": MESSAGE_TYPE, "connection_id": connection_id}
    if handoff:
        message["reason"] = HANDOFF
    return json.dumps(message, separators=(",", ":"))


def parse_message(body: str) -> Hint | None:
    """The hint of a valid notification, or None for anything else."""
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    if not isinstance(payload, dict) or payload.get("type") != MESSAGE_TYPE:
        return None
    connection_id = payload.get("connection_id")
    if not isinstance(connection_id, str) or not ID_PATTERN.fullmatch(connection_id):
        return None
    return Hint(connection_id, handoff=payload.get("reason") == HANDOFF)


@dataclass(slots=True, eq=False)  # identity: two hints for one id are two entries
class _Outgoing:
    connection_id: str
    body: str
    sent: bool = False  # sent in some caller's batch (or given up with it): nothing left to do


class Notifier:
    """Sends change notifications; a no-op without a queue. Never raises.

    Sends are coalesced: one round of sends is in flight at a time, and the hints that arrive
    meanwhile go out together in the next one, so the first hint of a burst leaves at once and
    none waits for more than one round before it. A round is up to SENDERS SendMessageBatch
    requests at once, MAX_MESSAGES hints each. A leaving worker's releases land within
    milliseconds of each other: sent one by one, each hint cost the worker a request and the
    queue a message write, and a burst of 20-27 took 100-250 ms of a handoff's critical path on
    the local fleet (bench/handoff_trace.py). Sent one batch at a time, a burst of 400 took 40
    round trips and 129 of its hints timed out (the handoff of a worker with 400 connections,
    against the local SQS); in rounds of SENDERS batches it takes 6."""

    def __init__(self, client: SQSClient | None, queue_url: str | None, *, timeout: float = 2.0) -> None:
        self._client = client
        self._queue_url = queue_url
        self._timeout = timeout
        self._outgoing: list[_Outgoing] = []  # not yet taken into a batch, oldest first
        self._sending = asyncio.Lock()  # FIFO: each caller's turn comes after the earlier ones'

    @property
    def enabled(self) -> bool:
        return self._client is not None and bool(self._queue_url)

    async def connection_changed(self, connection_id: str, *, handoff: bool = False) -> None:
        """Tell some worker that `connection_id` changed (`handoff`: released by a leaving worker).
        Returns once its hint is sent (possibly in another caller's batch). Bounded by `timeout`;
        errors are logged."""
        if self._client is None or not self._queue_url:
            return
        mine = _Outgoing(connection_id, encode_message(connection_id, handoff=handoff))
        self._outgoing.append(mine)
        batch: list[_Outgoing] = []
        try:
            async with asyncio.timeout(self._timeout), self._sending:
                if mine.sent:
                    return  # an earlier caller's batch carried it
                batch = self._take_round(mine)
                await self._send_round(self._client, self._queue_url, batch)
        except TimeoutError:
            log.warning(
                "notification timed out; peers will see the change at reconcile",
                connection_id=connection_id,
                timeout_seconds=self._timeout,
                batch=len(batch),
            )
        except Exception as exc:
            log.warning(
                "notification failed; peers will see the change at reconcile",
                connection_id=connection_id,
                batch=len(batch),
                error=f"{type(exc).__name__}: {exc}",
            )
        finally:
            if mine in self._outgoing:  # timed out waiting for its turn: nobody sends it now
                self._outgoing.remove(mine)

    def _take_round(self, mine: _Outgoing) -> list[_Outgoing]:
        """`mine` and the oldest others waiting, at most one round's, marked as taken."""
        others = [entry for entry in self._outgoing if entry is not mine][: SENDERS * MAX_MESSAGES - 1]
        batch = [mine, *others]
        taken = {id(entry) for entry in batch}
        self._outgoing = [entry for entry in self._outgoing if id(entry) not in taken]
        for entry in batch:
            entry.sent = True
        return batch

    @classmethod
    async def _send_round(cls, client: SQSClient, queue_url: str, taken: list[_Outgoing]) -> None:
        """`taken` in batches of MAX_MESSAGES, all at once; a batch that fails is logged alone."""
        batches = [taken[start : start + MAX_MESSAGES] for start in range(0, len(taken), MAX_MESSAGES)]
        results = await asyncio.gather(
            *(cls._send_batch(client, queue_url, batch) for batch in batches), return_exceptions=True
        )
        for batch, result in zip(batches, results, strict=True):
            if isinstance(result, BaseException):
                log.warning(
                    "notification failed; peers will see the change at reconcile",
                    connection_ids=[entry.connection_id for entry in batch],
                    error=f"{type(result).__name__}: {result}",
                )

    @staticmethod
    async def _send_batch(client: SQSClient, queue_url: str, batch: list[_Outgoing]) -> None:
        response = await client.send_message_batch(
            QueueUrl=queue_url,
            Entries=[{"Id": str(index), "MessageBody": entry.body} for index, entry in enumerate(batch)],
        )
        for failure in response.get("Failed", []):
            index = int(failure.get("Id", "-1"))
            log.warning(
                "notification failed; peers will see the change at reconcile",
                connection_id=batch[index].connection_id if 0 <= index < len(batch) else None,
                code=failure.get("Code"),
            )
        log.debug("hints sent", connection_ids=[entry.connection_id for entry in batch])


def _backoff_delays(base: float = BACKOFF_BASE_SECONDS, cap: float = BACKOFF_CAP_SECONDS) -> Iterator[float]:
    """Capped exponential backoff with jitter: each delay is uniform in [d/2, d]."""
    attempt = 0
    while True:
        delay = min(cap, base * 2**attempt)
        yield random.uniform(delay / 2, delay)
        attempt = min(attempt + 1, 30)


async def _sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> None:
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        pass


async def _delete(client: SQSClient, queue_url: str, messages: list[MessageTypeDef]) -> None:
    entries: list[DeleteMessageBatchRequestEntryTypeDef] = [
        {"Id": str(index), "ReceiptHandle": message["ReceiptHandle"]}
        for index, message in enumerate(messages)
        if "ReceiptHandle" in message
    ]
    if not entries:
        return
    try:
        result = await client.delete_message_batch(QueueUrl=queue_url, Entries=entries)
    except Exception as exc:
        # The messages become visible again and are re-read: a duplicate hint is harmless.
        log.warning("deleting notifications failed", error=f"{type(exc).__name__}: {exc}")
        return
    for failure in result.get("Failed", []):
        log.warning("deleting a notification failed", code=failure.get("Code"), entry=failure.get("Id"))


async def notifications(
    client: SQSClient,
    queue_url: str,
    *,
    wait_seconds: int = 2,
    stop: asyncio.Event,
) -> AsyncIterator[Hint]:
    """Yield hints from the notification queue until `stop` is set.

    Long-polls for up to `wait_seconds`, so it ends at most about `wait_seconds` after `stop` is
    set. Every received message is deleted; the delete is in flight while its hints are handled
    and always lands (or fails) before the next receive, so a consumer that passes a hint on
    never meets the original again (a hint may be duplicated by a failed delete, never looped).
    Yielding only after the delete's round trip put it on every hint's path: one more request
    between a leaving worker's release and the claim that follows it. Errors back off (capped,
    jittered) and never end the iteration.
    """
    delays = _backoff_delays()
    deleting: asyncio.Future[None] | None = None
    try:
        while not stop.is_set():
            if deleting is not None:
                await deleting
                deleting = None
            try:
                async with asyncio.timeout(wait_seconds + RECEIVE_SLACK_SECONDS):
                    response = await client.receive_message(
                        QueueUrl=queue_url, WaitTimeSeconds=wait_seconds, MaxNumberOfMessages=MAX_MESSAGES
                    )
            except Exception as exc:  # includes TimeoutError; CancelledError propagates
                delay = next(delays)
                log.warning(
                    "receiving notifications failed; backing off",
                    error=f"{type(exc).__name__}: {exc}",
                    retry_in_seconds=round(delay, 2),
                )
                await _sleep_unless_stopped(stop, delay)
                continue
            delays = _backoff_delays()  # a good call resets the backoff

            messages = response.get("Messages", [])
            if not messages:
                continue
            deleting = asyncio.ensure_future(_delete(client, queue_url, messages))
            hints: dict[str, Hint] = {}  # one per connection id: a handoff if any of them is
            for message in messages:
                body = message.get("Body", "")
                hint = parse_message(body)
                if hint is None:
                    log.warning("dropping a malformed notification", body=body[:200])
                    continue
                previous = hints.get(hint.connection_id)
                if previous is None or not previous.handoff:
                    hints[hint.connection_id] = hint
            for hint in hints.values():
                log.debug("hint received", connection_id=hint.connection_id, handoff=hint.handoff)
                yield hint
        if deleting is not None:
            await deleting
            deleting = None
    finally:
        if deleting is not None:  # the consumer left mid-batch: its messages come back later
            deleting.cancel()
