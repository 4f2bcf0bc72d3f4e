"""The file `connections apply -f FILE` reads: every entry validated before anything is written.

    connections:
      - id: feed-1                       # required: [A-Za-z0-9._:-]{1,128}
        url: wss://feeds.example.com/1   # seqfeed/1
        state: started                   # started (the default) | stopped
      - id: bsky
        preset: jetstream                # a shipped preset …
        params: {collections: [app.bsky.feed.post]}   # … and its parameters (a list, or a,b,c)
      - id: ha
        config: {connect: {url: …}, …}   # generic/1 inline (or a plugin's, by its "protocol")

Each entry takes exactly one of `url`, `preset` (+ `params`) and `config`, and goes through the
same validation as `connections add --url/--preset/--config` (cli/feeds.py: the registry, the
generic/1 validator, the presets, the worker's ws:// rule). Every problem is one line naming the
entry (`connections[3] (feed-1)`) and the field; all of them are reported, and a file with any
problem writes nothing. The file's shape is published as connections-apply.schema.json (beside
this module) for editors.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import click

from leaseworker.cli import feeds
from leaseworker.cli.errors import CliUsageError
from leaseworker.lease.model import STARTED, STOPPED, InvalidConnectionId, check_connection_id

MAX_APPLY_BYTES: Final = 64 * 1024 * 1024
MAX_APPLY_NODES: Final = 5_000_000  # ~10,000 entries of generic/1 configs fit with room
MAX_ERRORS_SHOWN: Final = 50
ENTRY_FIELDS: Final = ("id", "url", "preset", "params", "config", "state")
TOP_LEVEL: Final = ("connections", "$schema")
STATES: Final = {"started": STARTED, "stopped": STOPPED}
_PARAM_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class Desired:
    """One validated entry: what the connection should be."""

    index: int
    connection_id: str
    feed: feeds.Feed
    state: str  # STARTED | STOPPED


class InvalidFile(CliUsageError):
    """Exit 2 with one line per problem; nothing was written."""

    def __init__(self, source: str, problems: list[str]) -> None:
        super().__init__(f"{source}: {len(problems)} invalid entr{'y' if len(problems) == 1 else 'ies'}")
        self.problems = problems

    def show(self, file: Any = None) -> None:
        for line in self.problems[:MAX_ERRORS_SHOWN]:
            click.echo(f"error: {line}", err=True)
        if len(self.problems) > MAX_ERRORS_SHOWN:
            click.echo(f"error: … and {len(self.problems) - MAX_ERRORS_SHOWN} more", err=True)
        click.echo(f"error: {self.message}: nothing was written", err=True)


def load_desired(path: str, env: Mapping[str, str]) -> list[Desired]:
    """The file's entries, each validated; InvalidFile lists every problem at once."""
    source = "<stdin>" if path == "-" else path
    document = feeds.load_file(path, option="-f", max_bytes=MAX_APPLY_BYTES, max_nodes=MAX_APPLY_NODES)
    problems: list[str] = []
    for key in document:
        if key not in TOP_LEVEL:
            problems.append(
                f"{key}: unknown top-level field{_did_you_mean(key, TOP_LEVEL)}; the file is "
                "{connections: [...]}"
            )
    entries = document.get("connections")
    if not isinstance(entries, list):
        problems.append("connections: must be a list of connections (an empty list is allowed)")
        raise InvalidFile(source, problems)
    desired: list[Desired] = []
    first_at: dict[str, int] = {}
    for index, entry in enumerate(entries):
        raw_id = entry.get("id") if isinstance(entry, dict) else None
        if isinstance(raw_id, str):
            if raw_id in first_at:
                problems.append(f"{_label(index, raw_id)}: id: also given at connections[{first_at[raw_id]}]")
                continue
            first_at[raw_id] = index
        try:
            desired.append(validate_entry(index, entry, env))
        except EntryError as error:
            problems.append(str(error))
    if problems:
        raise InvalidFile(source, problems)
    return desired


class EntryError(ValueError):
    """One entry's problem, as its one line."""


def validate_entry(index: int, entry: Any, env: Mapping[str, str]) -> Desired:
    if not isinstance(entry, dict):
        raise EntryError(f"connections[{index}]: must be a mapping with an id, not {feeds._kind(entry)}")
    raw_id = entry.get("id")
    label = _label(index, raw_id if isinstance(raw_id, str) else None)

    def fail(field: str, rule: str) -> EntryError:
        return EntryError(f"{label}: {field}: {rule}")

    for key in entry:
        if key not in ENTRY_FIELDS:
            raise fail(str(key), f"unknown field{_did_you_mean(str(key), ENTRY_FIELDS)}")
    if not isinstance(raw_id, str):
        raise fail("id", "required: a connection id, [A-Za-z0-9._:-]{1,128}")
    try:
        connection_id = check_connection_id(raw_id)
    except InvalidConnectionId as error:
        raise fail("id", str(error)) from None
    state = entry.get("state", "started")
    if not isinstance(state, str) or state.lower() not in STATES:
        raise fail("state", f"must be started or stopped, not {state!r}")
    given = [field for field in ("url", "preset", "config") if field in entry]
    if len(given) != 1:
        got = f" (got {' and '.join(given)})" if given else ""
        raise EntryError(f"{label}: give exactly one of url, preset or config{got}")
    if "params" in entry and "preset" not in entry:
        raise fail("params", "goes with preset")
    try:
        feed = _feed(entry, env, fail)
    except CliUsageError as error:
        raise EntryError(f"{label}: {_field_message(given[0], entry, error.message)}") from None
    return Desired(index, connection_id, feed, STATES[state.lower()])


def _feed(entry: dict[str, Any], env: Mapping[str, str], fail: Any) -> feeds.Feed:
    if "url" in entry:
        url = entry["url"]
        if not isinstance(url, str):
            raise fail("url", "must be a string: the upstream's ws:// or wss:// address")
        return feeds.feed_from_url(url, env)
    if "config" in entry:
        config = entry["config"]
        if not isinstance(config, dict):
            raise fail("config", "must be a mapping: a generic/1 config (or a plugin's, by its protocol)")
        return feeds.feed_from_object(config, env)
    name = entry["preset"]
    if not isinstance(name, str):
        raise fail("preset", "must be a preset's name")
    return feeds.feed_from_preset(name, _param_pairs(entry.get("params", {}), fail), env)


def _param_pairs(params: Any, fail: Any) -> list[str]:
    """`params` as the `k=v` strings `--param` takes: a list value becomes `a,b,c`."""
    if not isinstance(params, dict):
        raise fail("params", "must be a mapping of parameter names to values")
    pairs = []
    for name, value in params.items():
        if not _PARAM_NAME.fullmatch(name):
            raise fail(f"params.{name}", "is not a parameter name")
        values = value if isinstance(value, list) else [value]
        texts = []
        for element in values:
            if isinstance(element, bool) or not isinstance(element, str | int | float):
                raise fail(f"params.{name}", "must be a string, a number or a list of them")
            text = str(element)
            if isinstance(value, list) and "," in text:
                raise fail(f"params.{name}", f"an element may not contain ',': {text[:40]!r}")
            texts.append(text)
        pairs.append(f"{name}={','.join(texts)}")
    return pairs


def _field_message(field: str, entry: dict[str, Any], message: str) -> str:
    """The validator's one line, led by the field of the entry it is about."""
    if field == "preset":
        if "parameter" in message:  # unknown, missing or malformed: the entry's params
            return f"params: {message}"
        if message.startswith(("preset ", "unknown preset")):
            return message
        return f"preset {entry['preset']!r}: {message}"  # the expanded config, e.g. its connect.url
    return message if message.startswith(field) else f"{field}: {message}"


def _label(index: int, connection_id: str | None) -> str:
    return f"connections[{index}] ({connection_id[:80]})" if connection_id else f"connections[{index}]"


def _did_you_mean(key: str, known: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else f"; known: {', '.join(known)}"
