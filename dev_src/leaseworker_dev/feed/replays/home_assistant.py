"""A local Home Assistant WebSocket API (`/api/websocket`), from its public documentation:
https://developers.home-assistant.io/docs/api/websocket.

- Authentication phase: the server sends `{"type": "auth_required", "ha_version"}`; the client
  sends `{"type": "auth", "access_token"}`; the server answers `{"type": "auth_ok",
  "ha_version"}`, or `{"type": "auth_invalid", "message"}` and closes.
- Command phase: every message carries an integer `id` that must increase within the
  connection, else `{"id", "type": "result", "success": false, "error": {"code": "id_reuse",
  "message": "Identifier values have to increase."}}`.
- `{"id", "type": "subscribe_events", "event_type"?}` → `{"id", "type": "result", "success":
  true, "result": null}`, then `{"id", "type": "event", "event": {"event_type", "data",
  "origin", "time_fired", "context"}}` for every event of that type.
- `{"id", "type": "ping"}` → `{"id", "type": "pong"}`.
- It cannot replay. The replay's events are `state_changed` of `sensor.replay_counter`, whose
  state counts up (n), or, for another event type, `{"n": n}` as the event's data.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from websockets.http11 import Request, Response

from leaseworker_dev.feed.replays.base import (
    Conn,
    Feed,
    ReplayServer,
    Tape,
    http_error,
    iso,
    register,
    run_until_first,
    sleep_until,
    wall_ms,
)

HA_VERSION = "2024.6.0"
REPLAY_TOKEN = "replay-token"
AUTH_TIMEOUT_S = 10.0
ENTITY = "sensor.replay_counter"


def event(event_type: str, n: int) -> dict[str, Any]:
    fired = iso(wall_ms())
    context = {"id": f"01J0REPLAY{n:016d}", "parent_id": None, "user_id": None}
    if event_type == "state_changed":
        data: dict[str, Any] = {
            "entity_id": ENTITY,
            "old_state": {"entity_id": ENTITY, "state": str(n - 1), "attributes": {}, "last_changed": fired},
            "new_state": {"entity_id": ENTITY, "state": str(n), "attributes": {}, "last_changed": fired},
        }
    else:
        data = {"n": n}
    return {
        "event_type": event_type,
        "data": data,
        "origin": "LOCAL",
        "time_fired": fired,
        "context": context,
    }


def event_number(event_body: dict[str, Any]) -> int:
    """The n of a replay event (for tests reading records back)."""
    data = event_body["data"]
    return int(data["new_state"]["state"]) if "new_state" in data else int(data["n"])


@register
class HomeAssistant(Feed):
    name: ClassVar[str] = "home-assistant"
    ws_path: ClassVar[str] = "/api/websocket"

    def __init__(self, server: ReplayServer, *, token: str = REPLAY_TOKEN) -> None:
        super().__init__(server)
        self.token = token
        self.tape: Tape = server.tape()

    def refuse(self, request: Request) -> Response | None:
        if request.path.split("?")[0].rstrip("/") != "/api/websocket":
            return http_error(404, "404: Not Found")
        return None

    async def session(self, conn: Conn) -> None:
        await conn.send({"type": "auth_required", "ha_version": HA_VERSION})
        try:
            auth = await conn.recv_json(AUTH_TIMEOUT_S)
        except TimeoutError:
            await conn.close(1000, "auth timeout")
            return
        if not isinstance(auth, dict) or auth.get("type") != "auth" or auth.get("access_token") != self.token:
            await conn.send({"type": "auth_invalid", "message": "Invalid access token or password"})
            await conn.close(1000, "")
            return
        await conn.send({"type": "auth_ok", "ha_version": HA_VERSION})
        subscriptions: dict[int, tuple[str | None, int]] = {}  # id -> (event_type, next n)
        await run_until_first(self.commands(conn, subscriptions), self.pump(conn, subscriptions))

    async def commands(self, conn: Conn, subscriptions: dict[int, tuple[str | None, int]]) -> None:
        last_id = 0
        while True:
            message = await conn.recv_json()
            if (
                not isinstance(message, dict)
                or not isinstance(message.get("id"), int)
                or isinstance(message.get("id"), bool)
            ):
                await conn.send(
                    {
                        "id": None,
                        "type": "result",
                        "success": False,
                        "error": {"code": "invalid_format", "message": "Message incorrectly formatted."},
                    }
                )
                continue
            msg_id: int = message["id"]
            if msg_id <= last_id:
                await conn.send(
                    {
                        "id": msg_id,
                        "type": "result",
                        "success": False,
                        "error": {"code": "id_reuse", "message": "Identifier values have to increase."},
                    }
                )
                continue
            last_id = msg_id
            kind = message.get("type")
            if kind == "ping":
                await conn.send({"id": msg_id, "type": "pong"})
            elif kind == "subscribe_events":
                event_type = message.get("event_type")
                subscriptions[msg_id] = (
                    event_type if isinstance(event_type, str) else None,
                    self.tape.head(time.monotonic()) + 1,
                )
                await conn.send({"id": msg_id, "type": "result", "success": True, "result": None})
            else:
                await conn.send(
                    {
                        "id": msg_id,
                        "type": "result",
                        "success": False,
                        "error": {"code": "unknown_command", "message": "Unknown command."},
                    }
                )

    async def pump(self, conn: Conn, subscriptions: dict[int, tuple[str | None, int]]) -> None:
        while True:
            head = self.tape.head(time.monotonic())
            for sub_id, (event_type, next_n) in list(subscriptions.items()):
                for n in range(next_n, head + 1):
                    body = event(event_type or "state_changed", n)
                    message = {"id": sub_id, "type": "event", "event": body}
                    await conn.send_data(message, [(None, n, message)])
                subscriptions[sub_id] = (event_type, max(next_n, head + 1))
            await sleep_until(self.tape.time_of(head + 1))
