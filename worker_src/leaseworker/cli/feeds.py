"""What `connections add` stores for a feed, validated in full before anything is written.

`connections add ID` takes exactly one source (docs/design.md §4, §6):

- `--url URL`: `seqfeed/1`, no config;
- `--config FILE` (JSON or YAML, `-` for stdin): a top-level `"protocol"` names the protocol
  (default `generic/1`); the rest of the file is its config. For `generic/1` the stored URL is
  `connect.url`; for a plugin it is the file's top-level `url` (kept out of the plugin's config)
  or its `connect.url`;
- `--preset NAME --param k=v …`: a shipped preset expanded into a `generic/1` config.

Every path ends in `Feed`: the protocol, the URL template, the compact JSON config (without the
`protocol` key, at most MAX_CONFIG_BYTES) and the preset's name. The config has been parsed,
built through the registry (so plugins validate their own), and its URL checked against the
worker's wss rule. Every refusal is a CliUsageError of one line naming the field and the rule.
Nothing here resolves a `{{secret:…}}` or `{{env:…}}` reference: they are stored as written.

How a stored feed is shown (`list`, `show`, `apply`'s plan) is in `cli/connection_views.py`.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import yaml

from leaseworker.cli.errors import CliUsageError
from leaseworker.lease.admin_errors import check_ws_url
from leaseworker.protocol import presets
from leaseworker.protocol.adapter import ConfigError
from leaseworker.protocol.generic import parse_config
from leaseworker.protocol.registry import (
    GENERIC,
    MAX_CONFIG_BYTES,
    SEQFEED,
    ProtocolSpec,
    build,
    known_protocols,
)
from leaseworker.settings import SettingsError, allow_insecure_ws_from
from leaseworker.worker.backoff import FatalUpstreamError, check_upstream_url

MAX_FILE_BYTES: Final = 1024 * 1024  # far above any config that fits MAX_CONFIG_BYTES
MAX_NODES: Final = 20_000  # a 16 KB config has fewer; YAML aliases can fan out far more
MAX_DEPTH: Final = 64
INSECURE_VARIABLE: Final = "ALLOW_INSECURE_WS"
_SAFE_LOADER: Final[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_SECTION: Final = re.compile(r"\{\{\s*#\s*cursor\s*\}\}.*?\{\{\s*/\s*cursor\s*\}\}", re.DOTALL)
TEMPLATE_TAG: Final = re.compile(r"\{\{[^{}]*\}\}")  # one tag of a URL template


@dataclass(frozen=True, slots=True)
class Feed:
    """What `LeaseTableAdmin.add` stores: all of it validated."""

    protocol: str
    ws_url: str
    protocol_config: str | None = None
    preset: str | None = None


def _refuse(path: str, rule: str) -> CliUsageError:
    return CliUsageError(_one_line(str(ConfigError(path, rule))))


def _one_line(text: str) -> str:
    return " ".join(text.split())


# ------------------------------------------------------------------------------ the sources


def feed_from_url(url: str, env: Mapping[str, str]) -> Feed:
    """`--url`: a seqfeed/1 connection."""
    try:
        check_ws_url(url)
    except ValueError as error:
        raise CliUsageError(_one_line(str(error))) from None
    check_insecure("url", url, env)
    return Feed(SEQFEED, url)


def feed_from_file(path: str, env: Mapping[str, str]) -> Feed:
    """`--config FILE`: JSON or YAML (`-`: stdin), generic/1 or the protocol its `protocol` names."""
    return feed_from_object(load_file(path), env)


def feed_from_preset(name: str, params: Iterable[str], env: Mapping[str, str]) -> Feed:
    """`--preset NAME --param k=v …`: the preset expanded into a generic/1 config."""
    try:
        config = presets.expand(name, parse_params(params))
    except ValueError as error:
        raise CliUsageError(_one_line(str(error))) from None
    feed = feed_from_object(config, env, where=f"preset {name!r}: ")
    return Feed(feed.protocol, feed.ws_url, feed.protocol_config, name)


def parse_params(pairs: Iterable[str]) -> dict[str, str]:
    """`k=v` strings as a dict; a malformed or repeated one is a one-line usage error."""
    params: dict[str, str] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        key = key.strip()
        if not equals or not key:
            raise CliUsageError(f"invalid --param {pair[:80]!r}: must be NAME=VALUE")
        if key in params:
            raise CliUsageError(f"--param {key!r} is given twice: a list parameter takes a,b,c")
        params[key] = value
    return params


# ----------------------------------------------------------------------------- the file


def load_file(
    path: str, *, option: str = "--config", max_bytes: int = MAX_FILE_BYTES, max_nodes: int = MAX_NODES
) -> dict[str, Any]:
    """The file's top-level mapping: JSON (read as JSON, which is fast) or YAML (libyaml's safe
    loader when it is there). `option` names the flag in errors; `connections apply -f` takes
    larger files than `--config`."""
    where = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            raw = sys.stdin.buffer.read(max_bytes + 1)
        else:
            with open(path, "rb") as file:
                raw = file.read(max_bytes + 1)
    except OSError as error:
        raise CliUsageError(f"cannot read {option} {where}: {error.strerror or error}") from None
    if len(raw) > max_bytes:
        raise CliUsageError(f"{option} {where}: larger than {max_bytes} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CliUsageError(f"{option} {where}: not UTF-8 (byte {error.start})") from None
    try:
        value = _parse(text)
    except yaml.YAMLError as error:
        raise CliUsageError(f"{option} {where}: not JSON or YAML: {_yaml_problem(error)}") from None
    except RecursionError:
        raise CliUsageError(f"{option} {where}: nested too deeply") from None
    if not isinstance(value, dict):
        raise CliUsageError(f"{option} {where}: must be a mapping (a JSON object), not {_kind(value)}")
    _check_plain(value, max_nodes)
    return value


def _parse(text: str) -> Any:
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except ValueError:
            pass  # YAML's flow style also starts with "{": let YAML read it and say what is wrong
    return yaml.load(text, Loader=_SAFE_LOADER)  # SafeLoader, or libyaml's CSafeLoader: both safe


def _yaml_problem(error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or getattr(error, "context", None) or "invalid"
    where = f"line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""
    return _one_line(f"{where}{problem}")[:200]


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


def _check_plain(root: dict[str, Any], max_nodes: int = MAX_NODES) -> None:
    """Only what JSON can say: string keys, finite numbers, no YAML dates, bounded size and depth
    (YAML aliases can make a small file a huge or recursive tree)."""
    stack: list[tuple[Any, str, int]] = [(root, "", 0)]
    seen = 0
    while stack:
        node, path, depth = stack.pop()
        seen += 1
        if seen > max_nodes or depth > MAX_DEPTH:
            raise _refuse(
                path[:60], f"too large or nested too deeply (at most {MAX_CONFIG_BYTES} bytes of JSON)"
            )
        if isinstance(node, dict):
            for key, value in node.items():
                if not isinstance(key, str):
                    raise _refuse(path, f"key {key!r} must be a string")
                stack.append((value, f"{path}.{key}" if path else key, depth + 1))
        elif isinstance(node, list):
            stack.extend((value, f"{path}[{index}]", depth + 1) for index, value in enumerate(node))
        elif isinstance(node, float) and not math.isfinite(node):
            raise _refuse(path, "must be a finite number")
        elif node is not None and not isinstance(node, str | int | float | bool):
            raise _refuse(path, f"a {type(node).__name__} is not a JSON value (quote it as a string)")


# --------------------------------------------------------------------------- validation


def feed_from_object(config: Mapping[str, Any], env: Mapping[str, str], *, where: str = "") -> Feed:
    """Validate a parsed config (its `protocol` key selects the protocol) into a Feed."""
    try:
        return _feed(dict(config), env)
    except ValueError as error:  # ConfigError, and any other one-line rule a plugin breaks
        raise CliUsageError(_one_line(f"{where}{error}")) from None


def _feed(config: dict[str, Any], env: Mapping[str, str]) -> Feed:
    name = config.pop("protocol", GENERIC)
    if not isinstance(name, str) or not name:
        raise ConfigError("protocol", "must be a protocol name such as 'generic/1'")
    if name == SEQFEED:
        raise ConfigError("protocol", "seqfeed/1 takes no config: add it with --url URL")
    if name != GENERIC:
        if name not in known_protocols():
            known = ", ".join(known_protocols())
            raise ConfigError("protocol", f"unknown protocol {name!r} (known: {known})")
        url, url_path = _plugin_url(name, config)
    text = compact(config) if config else None
    if text is not None:
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > MAX_CONFIG_BYTES:
            raise ConfigError("", f"is {size} bytes as compact JSON, at most {MAX_CONFIG_BYTES}")
    if name == GENERIC:
        parse_config(config)  # the typed validation: every field's path and rule
        connect = config.get("connect")
        assert isinstance(connect, dict) and isinstance(connect.get("url"), str)
        url, url_path = connect["url"], "connect.url"
    build(ProtocolSpec(name, url, config if config or name == GENERIC else None))
    try:
        check_ws_url(url)
    except ValueError:
        raise ConfigError(url_path, "must be a ws:// or wss:// URL with a host") from None
    check_insecure(url_path, url, env)
    return Feed(name, url, text)


def _plugin_url(name: str, config: dict[str, Any]) -> tuple[str, str]:
    """A plugin's upstream address: the file's top-level `url` (not part of the plugin's own
    config), or its `connect.url`."""
    if "url" in config:
        url = config.pop("url")
        if not isinstance(url, str):
            raise ConfigError("url", "must be a string: the upstream's ws:// or wss:// address")
        return url, "url"
    connect = config.get("connect")
    if isinstance(connect, dict) and isinstance(connect.get("url"), str):
        return str(connect["url"]), "connect.url"
    raise ConfigError("url", f"{name} needs the upstream address: a top-level url (or connect.url)")


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def allow_insecure(env: Mapping[str, str]) -> bool:
    """ALLOW_INSECURE_WS as the worker reads it (settings.py)."""
    try:
        return allow_insecure_ws_from(env)
    except SettingsError as error:
        raise CliUsageError(str(error)) from None


def check_insecure(path: str, url: str, env: Mapping[str, str]) -> None:
    """The worker's rule (docs/design.md §4.1): ws:// only to a loopback host unless ALLOW_INSECURE_WS.

    A template is checked with its tags rendered harmlessly (no cursor, each tag a placeholder):
    a ws:// URL whose host is itself a template cannot be shown to be loopback, so it is refused
    as well. Errors show the host, never the URL (its query may carry a token)."""
    insecure = allow_insecure(env)
    try:
        parts = urlsplit(url)
    except ValueError as error:
        raise _refuse(path, f"not a URL: {error}") from None
    if parts.scheme.lower() == "ws" and "{{" in parts.netloc and not insecure:
        raise _refuse(
            path, f"ws:// needs a literal loopback host (the host is a template) or {INSECURE_VARIABLE}=true"
        )
    rendered = TEMPLATE_TAG.sub("x", _SECTION.sub("", url))
    try:
        check_upstream_url(rendered, allow_insecure=insecure)
    except FatalUpstreamError:
        host = parts.hostname or "?"
        if parts.scheme.lower() == "ws":
            raise _refuse(
                path, f"ws:// to non-loopback host {host!r} needs {INSECURE_VARIABLE}=true: use wss://"
            ) from None
        raise _refuse(path, "must be a ws:// or wss:// URL with a host and a valid port") from None
