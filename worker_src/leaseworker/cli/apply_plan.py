"""What `connections apply` changes: a pure diff of the file's entries against the table's items.

Per connection id, one change at most:
- `add`: the file lists it and the table has no live item (a tombstone counts as none: `add`
  resurrects it with its epoch kept);
- `update`: its feed differs (protocol, url, config, preset), and perhaps its state too: one write;
- `start` / `stop`: only its desired state differs;
- `remove` (only with --prune): the table has it and the file does not. It is stopped first if
  STARTED, then removed by the operator-safety rules of `connections remove` (lease/removal.py).

Configs are compared as JSON values, so reordering a mapping's keys changes nothing. Applying the
plan's changes, then planning again from the same file, gives no change: that is idempotence.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from leaseworker.cli.apply_file import Desired
from leaseworker.cli.connection_views import protocol_label, redacted_url
from leaseworker.cli.feeds import Feed
from leaseworker.lease.model import STARTED
from leaseworker.protocol.registry import SEQFEED

Kind = Literal["add", "update", "start", "stop", "remove"]
KINDS: Final[tuple[Kind, ...]] = ("add", "update", "start", "stop", "remove")
_SIGN: Final = {"add": "+", "update": "~", "start": "~", "stop": "~", "remove": "-"}
_DONE: Final = {
    "add": "added",
    "update": "updated",
    "start": "started",
    "stop": "stopped",
    "remove": "removed",
}


@dataclass(frozen=True, slots=True)
class Change:
    kind: Kind
    connection_id: str
    desired: Desired | None  # None for `remove`
    fields: tuple[str, ...] = ()  # `update`: what differs
    was_started: bool = False  # `remove`: it must be stopped first

    def line(self) -> str:
        """The diff line: `+ feed-1  add seqfeed/1 wss://… (started)`."""
        detail = ""
        if self.kind == "add" and self.desired is not None:
            feed = self.desired.feed
            label = protocol_label({"protocol": feed.protocol, "preset": feed.preset})
            detail = f" {label} {redacted_url(feed.ws_url)} ({self.desired.state.lower()})"
        elif self.kind == "update":
            detail = f" {', '.join(self.fields)}"
        elif self.kind == "remove":
            detail = " (not in the file; stop it first)" if self.was_started else " (not in the file)"
        return f"{_SIGN[self.kind]} {self.connection_id}  {self.kind}{detail}"


@dataclass(slots=True)
class Plan:
    changes: list[Change] = field(default_factory=list)
    unchanged: int = 0

    def count(self, kind: Kind) -> int:
        return sum(1 for change in self.changes if change.kind == kind)

    def summary(self, *, done: bool) -> str:
        """`2 added, 1 stopped` (done) or `2 to add, 1 to stop`; `unchanged` last."""
        parts = [
            f"{n} {_DONE[kind]}" if done else f"{n} to {kind}" for kind in KINDS if (n := self.count(kind))
        ]
        return ", ".join([*parts, f"{self.unchanged} unchanged"])


def make_plan(desired: Iterable[Desired], items: Iterable[Mapping[str, Any]], *, prune: bool) -> Plan:
    """The changes that make the table's live items (as `LeaseTableAdmin.list` gives them) match."""
    current = {str(item.get("connection_id")): item for item in items}
    plan = Plan()
    listed: set[str] = set()
    for entry in desired:
        listed.add(entry.connection_id)
        item = current.get(entry.connection_id)
        change = _change(entry, item)
        if change is None:
            plan.unchanged += 1
        else:
            plan.changes.append(change)
    if prune:
        for cid in sorted(current.keys() - listed):
            started = current[cid].get("desired_state") == STARTED
            plan.changes.append(Change("remove", cid, None, was_started=started))
    return plan


def _change(entry: Desired, item: Mapping[str, Any] | None) -> Change | None:
    cid = entry.connection_id
    if item is None:
        return Change("add", cid, entry)
    fields = feed_differences(entry.feed, item)
    state_differs = item.get("desired_state") != entry.state
    if fields:
        return Change("update", cid, entry, (*fields, *(["state"] if state_differs else [])))
    if state_differs:
        return Change("start" if entry.state == STARTED else "stop", cid, entry)
    return None


def feed_differences(feed: Feed, item: Mapping[str, Any]) -> list[str]:
    """Which of the stored feed's attributes differ from `feed`, by their names in the file."""
    differs = []
    if (item.get("protocol") or SEQFEED) != feed.protocol:
        differs.append("protocol")
    if item.get("ws_url") != feed.ws_url:
        differs.append("url")
    if _json(item.get("protocol_config")) != _json(feed.protocol_config):
        differs.append("config")
    if (item.get("preset") or None) != feed.preset:
        differs.append("preset")
    return differs


def _json(text: Any) -> Any:
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text  # not JSON (a hand-edited item): differs from any valid config
