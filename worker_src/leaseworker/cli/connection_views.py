"""How the CLI shows a connection: `list`'s table, `show`'s text, the objects `--json` prints
(docs/design.md §6), and the feed's parts as `apply`'s plan names them (the URL with its query
values redacted, the protocol and preset, the stored config as YAML, times as dates)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import yaml
from rich.table import Table
from rich.text import Text

from leaseworker.cli.feeds import TEMPLATE_TAG
from leaseworker.lease.vocabulary import SESSION_HELD
from leaseworker.protocol.generic import redact_url
from leaseworker.protocol.registry import SEQFEED

_SHOWN_FIRST = ("connection_id", "desired_state", "protocol", "preset", "ws_url")
# What `show` adds after a value, so that nobody reads the wrong number.
_NOTES = {
    "last_seq": "(the item's own; `checkpoint` is what a takeover resumes after)",
    "updated_at_ms": "(the item's last write; in session mode its checkpoints do not touch it)",
}
_SHOWN_APART = frozenset({"protocol_config"})
_TIMES = frozenset({"lease_expires_at_ms", "updated_at_ms"})


def with_protocol(item: dict[str, Any]) -> dict[str, Any]:
    """The item with its protocol attributes present (an item added before them is seqfeed/1)."""
    return {
        **item,
        "protocol": item.get("protocol") or SEQFEED,
        "protocol_config": item.get("protocol_config"),
        "preset": item.get("preset"),
        "cursor": item.get("cursor"),
    }


# docs/design.md §6: every object of `list --json` holds at least these, null when unset.
REPORTED_KEYS = (
    "connection_id",
    "desired_state",
    "ws_url",
    "last_seq",
    "lease_owner",
    "lease_epoch",
    "lease_expires_at_ms",
)


def reported(item: dict[str, Any]) -> dict[str, Any]:
    """An item as `--json` prints it. Every key of REPORTED_KEYS is present (a free connection's
    `lease_owner` is null). `last_seq` is the effective checkpoint (§2b: the newer of the item's
    own and its holder's batched entry), as `checkpoint` is; the item's own value is
    `item_last_seq`. URLs and configs are the stored values, for scripts: their secrets are
    references (`{{secret:NAME#KEY}}`), never resolved values."""
    out = {key: item.get(key) for key in REPORTED_KEYS} | item
    if isinstance(out.get("checkpoint"), int):
        out["item_last_seq"] = out["last_seq"]
        out["last_seq"] = out["checkpoint"]
    return out


def render_show(item: dict[str, Any], now_ms: int) -> str:
    """`show`'s text: one attribute a line, times as dates, the URL redacted, the config as YAML."""
    keys = [key for key in _SHOWN_FIRST if key in item]
    keys += sorted(key for key in item if key not in _SHOWN_FIRST and key not in _SHOWN_APART)
    width = max(len(key) for key in [*keys, "lease"])
    lines = [f"{'lease':<{width}}  {lease_status(item, now_ms)}"]
    for key in keys:
        value = item[key]
        if key == "ws_url":
            shown = redacted_url(value)
        elif key in _TIMES:
            shown = human_time(value, now_ms) if value else "-"
        elif value is None:
            shown = "-"
        else:
            shown = str(value)
        note = _NOTES.get(key) if key != "last_seq" or "checkpoint" in item else None
        lines.append(f"{key:<{width}}  {shown}" + (f"  {note}" if note and value is not None else ""))
    config = item.get("protocol_config")
    if config:
        lines.append("protocol_config (as stored; secrets are references):")
        lines.extend(f"  {line}" for line in config_for_display(config).splitlines())
    else:
        lines.append(f"{'protocol_config':<{width}}  -")
    return "\n".join(lines)


def render_table(items: list[dict[str, Any]], *, title: str | None = None) -> Table:
    """Connections as a table: whose lease, how long it has left, how far the checkpoint got."""
    now = int(time.time() * 1000)
    table = Table(title=title or f"{len(items)} connections", title_justify="left")
    columns = (
        "connection",
        "state",
        "protocol",
        "url",
        "owner",
        "epoch",
        "lease",
        "updated",
        "checkpoint",
        "last_error",
    )
    for column in columns:
        table.add_column(
            column, overflow="fold", justify="right" if column in ("epoch", "checkpoint") else "left"
        )
    for item in items:
        updated = int(item.get("updated_at_ms", 0) or 0)
        cells = (
            str(item.get("connection_id")),
            str(item.get("desired_state", "?")),
            protocol_label(item),
            redacted_url(item.get("ws_url")),
            str(item.get("lease_owner") or "-"),
            str(item.get("lease_epoch", 0)),
            lease_status(item, now),
            f"{(now - updated) / 1000:.0f} s ago" if updated else "-",
            str(item.get("checkpoint", item.get("last_seq", -1))),
            str(item.get("last_error") or ""),
        )
        # Text, not markup: `[jetstream]` and an upstream's error text are shown as they are.
        table.add_row(*(Text(cell) for cell in cells))
    return table


def lease_status(item: dict[str, Any], now_ms: int) -> str:
    """free | held by its session (session mode: live while the owner's session is) | N s left |
    expired N s ago (an owner that stopped renewing; a takeover is due)."""
    expires = int(item.get("lease_expires_at_ms", 0) or 0)
    if not item.get("lease_owner") or expires == 0:
        return "free"
    if expires == SESSION_HELD:
        return "held by its session"
    if expires > now_ms:
        return f"{(expires - now_ms) / 1000:.1f} s left"
    return f"expired {(now_ms - expires) / 1000:.1f} s ago"


def redacted_url(url: Any) -> str:
    """The URL (or URL template) with query values redacted. A template's tags are kept apart
    while it is split, so `{{#cursor}}` does not read as a fragment; a tag inside a query value
    is redacted with the value."""
    if not isinstance(url, str) or not url:
        return "-"
    tags: list[str] = []

    def hold(match: re.Match[str]) -> str:
        tags.append(match.group(0))
        return f"\ue000{len(tags) - 1}\ue001"

    redacted = redact_url(TEMPLATE_TAG.sub(hold, url))
    return re.sub("\ue000([0-9]+)\ue001", lambda m: tags[int(m.group(1))], redacted)


def protocol_label(item: Mapping[str, Any]) -> str:
    """`generic/1 [jetstream]`: the protocol, and the preset it came from."""
    protocol = str(item.get("protocol") or SEQFEED)
    preset = item.get("preset")
    return f"{protocol} [{preset}]" if preset else protocol


def config_for_display(text: Any) -> str:
    """The stored config (references only: nothing is resolved) as YAML, or the raw text when it
    is not the JSON object it should be."""
    if not isinstance(text, str):
        return ""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return yaml.safe_dump(value, sort_keys=False, allow_unicode=True, width=100).rstrip("\n")


def human_time(ms: Any, now_ms: int | None = None) -> str:
    """`2026-12-05 08:40:12 UTC (12 s ago)`; the session-held marker as "held by session"."""
    if isinstance(ms, bool) or not isinstance(ms, int | float):
        return str(ms)
    if ms == SESSION_HELD:
        return "held by session"
    if ms <= 0:
        return "-"
    now = int(time.time() * 1000) if now_ms is None else now_ms
    try:
        stamp = datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return str(ms)
    delta = (ms - now) / 1000
    return f"{stamp} ({_span(-delta)} ago)" if delta <= 0 else f"{stamp} (in {_span(delta)})"


def _span(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} d"
