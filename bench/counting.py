"""A counting proxy that also keeps one sample request of each kind, for pricing.

It parses the HTTP requests a worker sends to DynamoDB Local (the proxy is in between; it never
changes a byte) and files each one under a kind: the operation, the item class its key names
(connection, session, checkpoint) and the first clause of its update expression.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from leaseworker.lease.vocabulary import CHECKPOINT_KEY_SUFFIX, WORKER_KEY_PREFIX
from leaseworker_dev.local.proxy import ProxyThread, TcpProxy

_TARGET = re.compile(rb"x-amz-target:\s*DynamoDB_\d+\.(\w+)", re.IGNORECASE)
_LENGTH = re.compile(rb"content-length:\s*(\d+)", re.IGNORECASE)
_FIRST_CLAUSE = re.compile(r"^(SET \w+|REMOVE \w+|ADD \w+)")


@dataclass
class Captured:
    counts: Counter[str] = field(default_factory=Counter)
    # Per kind, a request a later one of the same kind on the same key superseded where there
    # is one: replayed on the item as it is now, it makes the change the original made.
    samples: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    last: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    def record(self, operation: str, body: dict[str, Any]) -> None:
        kind = kind_of(operation, body)
        self.counts[kind] += 1
        key = (kind, json.dumps(body.get("Key"), sort_keys=True))
        previous = self.last.get(key)
        self.last[key] = body
        if previous is not None:
            self.samples[kind] = (operation, previous)
        elif kind not in self.samples or operation not in ("UpdateItem", "PutItem", "DeleteItem"):
            self.samples[kind] = (operation, body)


def item_class(key: dict[str, Any] | None) -> str:
    if not key:
        return ""
    cid = str(next(iter(key.get("connection_id", {}).values()), ""))
    if cid.startswith(WORKER_KEY_PREFIX):
        return "checkpoint" if cid.endswith(CHECKPOINT_KEY_SUFFIX) else "session"
    return "connection"


def kind_of(operation: str, body: dict[str, Any]) -> str:
    """e.g. `UpdateItem connection SET lease_expires_at_ms`, `Query by-state-expiry WORKER`."""
    if operation in ("Query", "Scan"):
        values = body.get("ExpressionAttributeValues", {})
        partition = next((str(next(iter(v.values()))) for v in values.values()), "")
        return f"{operation} {body.get('IndexName', 'table')} {partition}".strip()
    if operation == "BatchGetItem":
        keys = [k for request in body.get("RequestItems", {}).values() for k in request.get("Keys", [])]
        return f"BatchGetItem {item_class(keys[0]) if keys else ''}".strip()
    key = body.get("Key") or body.get("Item")
    clause = _FIRST_CLAUSE.match(str(body.get("UpdateExpression", "")))
    return " ".join(part for part in (operation, item_class(key), clause.group(1) if clause else "") if part)


class CapturingProxy(TcpProxy):
    def __init__(self, target_host: str, target_port: int) -> None:
        super().__init__(target_host, target_port)
        self.captured = Captured()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        count: bool,
        half_close: bool = False,
    ) -> None:
        pending = bytearray()
        while data := await reader.read(65536):
            if count:
                pending += data
                self._parse(pending)
            writer.write(data)
            await writer.drain()
        if half_close:
            writer.write_eof()
            return
        writer.transport.abort()

    def _parse(self, pending: bytearray) -> None:
        while (end := pending.find(b"\r\n\r\n")) >= 0:
            head = bytes(pending[:end])
            length = _LENGTH.search(head)
            size = int(length.group(1)) if length else 0
            if len(pending) < end + 4 + size:
                return
            body = bytes(pending[end + 4 : end + 4 + size])
            del pending[: end + 4 + size]
            target = _TARGET.search(head)
            if target:
                self.captured.record(target.group(1).decode(), json.loads(body or b"{}"))


class CapturingProxyThread(ProxyThread):
    """The ProxyThread's loop and lifecycle around a CapturingProxy."""

    def __init__(self, target_host: str, target_port: int) -> None:
        super().__init__(target_host, target_port)
        self.proxy = CapturingProxy(target_host, target_port)

    def __enter__(self) -> CapturingProxyThread:
        super().__enter__()
        return self

    def snapshot(self) -> Captured:
        return asyncio.run_coroutine_threadsafe(self._copy(), self._loop).result(5)

    async def _copy(self) -> Captured:
        assert isinstance(self.proxy, CapturingProxy)
        captured = self.proxy.captured
        return Captured(Counter(captured.counts), dict(captured.samples), dict(captured.last))
