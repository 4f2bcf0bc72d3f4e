"""Which protocol a connection speaks: the built-ins, and plugins through an entry-point group.

A connection item names its protocol (`protocol`, default `seqfeed/1`) and, for a configurable
one, carries `protocol_config` (JSON text). `build(spec)` turns that into an UpstreamProtocol, or
raises ConfigError with one line. A third-party package adds a protocol with an entry point in
the group `leaseworker.protocols`, named after the protocol (e.g. `atproto-firehose/1`), whose
value is a callable `factory(spec: ProtocolSpec) -> UpstreamProtocol` that validates the config
and raises ConfigError when it does not fit (docs/design.md §4.2, "Plugins").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from typing import Any, Final

from leaseworker.protocol.adapter import ConfigError, UpstreamProtocol

ENTRY_POINT_GROUP: Final = "leaseworker.protocols"
SEQFEED: Final = "seqfeed/1"
GENERIC: Final = "generic/1"
MAX_CONFIG_BYTES: Final = 16 * 1024


@dataclass(frozen=True, slots=True)
class ProtocolSpec:
    """What a connection item says about its protocol."""

    name: str
    ws_url: str
    config: Mapping[str, Any] | None = None


Factory = Callable[[ProtocolSpec], UpstreamProtocol]


def _seqfeed(spec: ProtocolSpec) -> UpstreamProtocol:
    from leaseworker.protocol.seqfeed import SeqfeedProtocol

    if spec.config:
        raise ConfigError("protocol_config", "seqfeed/1 takes no config")
    return SeqfeedProtocol(spec.ws_url)


def _generic(spec: ProtocolSpec) -> UpstreamProtocol:
    from leaseworker.protocol.generic import GenericProtocol, parse_config

    if spec.config is None:
        raise ConfigError("protocol_config", "generic/1 needs a config")
    protocol: UpstreamProtocol = GenericProtocol(parse_config(spec.config))
    return protocol


_BUILT_IN: Final[dict[str, Factory]] = {SEQFEED: _seqfeed, GENERIC: _generic}


@cache
def _plugins() -> dict[str, Callable[[], Any]]:
    """The installed plugins' entry points, by protocol name: loaded only when used."""
    found: dict[str, Callable[[], Any]] = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        if point.name not in _BUILT_IN:
            found[point.name] = point.load
    return found


def _factory(name: str) -> Factory:
    built_in = _BUILT_IN.get(name)
    if built_in is not None:
        return built_in
    loader = _plugins().get(name)
    if loader is None:
        known = ", ".join(sorted({*_BUILT_IN, *_plugins()}))
        raise ConfigError("protocol", f"unknown protocol {name!r} (known: {known})")
    factory: Factory = loader()  # the entry point's value is the factory
    return factory


def known_protocols() -> list[str]:
    return sorted({*_BUILT_IN, *_plugins()})


def parse_config_text(text: str | None) -> Mapping[str, Any] | None:
    """The stored `protocol_config` (JSON text) as an object; ConfigError if it is not one."""
    if text is None:
        return None
    if len(text.encode("utf-8", "surrogatepass")) > MAX_CONFIG_BYTES:
        raise ConfigError("protocol_config", f"must be at most {MAX_CONFIG_BYTES} bytes of JSON")
    try:
        value = json.loads(text)
    except ValueError as error:
        raise ConfigError("protocol_config", f"not JSON: {error}") from None
    if not isinstance(value, dict):
        raise ConfigError("protocol_config", "must be a JSON object")
    return value


def build(spec: ProtocolSpec) -> UpstreamProtocol:
    """The protocol a connection speaks; ConfigError (one line) if it cannot be built."""
    try:
        return _factory(spec.name)(spec)
    except ConfigError:
        raise
    except Exception as error:  # a plugin's bug must not crash the session: it is a config error
        raise ConfigError(
            "protocol", f"{spec.name} could not be built: {type(error).__name__}: {error}"
        ) from None
