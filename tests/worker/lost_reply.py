"""Lost replies from DynamoDB: the request reaches DynamoDB Local and is applied, the reply is not.

`LostReplies` wraps the real client (the table is still DynamoDB Local, never a fake). For the
UpdateItems that `match` selects, `remaining` times, it lets the write land and then either
- "timeout": never answers, so the caller's deadline fires (a reply slower than the deadline), or
- "retry": sends the same request again and returns that answer, as botocore does after a read
  timeout: the retry meets our own applied write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Literal, cast

from botocore.exceptions import ClientError
from types_aiobotocore_dynamodb import DynamoDBClient

Mode = Literal["timeout", "retry"]


class LostReplies:
    def __init__(
        self, client: DynamoDBClient, *, match: Callable[[dict[str, Any]], bool], mode: Mode
    ) -> None:
        self._client = client
        self.match = match
        self.mode: Mode = mode
        self.remaining = 0
        self.dropped = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def update_item(self, **kwargs: Any) -> Any:
        if self.remaining > 0 and self.match(kwargs):
            self.remaining -= 1
            await self._client.update_item(**kwargs)  # applied; its reply is lost
            self.dropped += 1
            if self.mode == "timeout":
                await asyncio.Event().wait()  # until the caller's deadline cancels us
            return await self._client.update_item(**kwargs)
        return await self._client.update_item(**kwargs)

    def as_client(self) -> DynamoDBClient:
        return cast(DynamoDBClient, self)


def is_claim(kwargs: dict[str, Any]) -> bool:
    """A claim or an acquire: the only UpdateItems that add 1 to the epoch."""
    return "ADD lease_epoch" in str(kwargs.get("UpdateExpression", ""))


class Refusals:
    """Wraps a real DynamoDB client: the `remaining` UpdateItems that `match` selects are
    refused with a ThrottlingException before reaching DynamoDB (nothing is applied)."""

    def __init__(self, client: DynamoDBClient, *, match: Callable[[dict[str, Any]], bool]) -> None:
        self._client = client
        self.match = match
        self.remaining = 0
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def update_item(self, **kwargs: Any) -> Any:
        if self.remaining > 0 and self.match(kwargs):
            self.remaining -= 1
            self.refused += 1
            error = {"Error": {"Code": "ThrottlingException", "Message": "injected"}}
            raise ClientError(error, "UpdateItem")  # type: ignore[arg-type]
        return await self._client.update_item(**kwargs)

    def as_client(self) -> DynamoDBClient:
        return cast(DynamoDBClient, self)


def releases_of(connection_id: str) -> Callable[[dict[str, Any]], bool]:
    """A release or a mark-failed of `connection_id`: the writes that remove the owner."""

    def match(kwargs: dict[str, Any]) -> bool:
        key = kwargs.get("Key", {}).get("connection_id", {}).get("S")
        return key == connection_id and "REMOVE lease_owner" in str(kwargs.get("UpdateExpression", ""))

    return match
