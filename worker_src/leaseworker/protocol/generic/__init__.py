"""`generic/1`: a declarative, Sans-I/O adapter for real feeds (docs/design.md §4.2).

Modules, by what each owns: `pointers` (RFC 6901), `templates` (rendering, `redact_url`),
`model` (the frozen config), `checks` and `config` (validation, `parse_config`), `decode`
(frames to values), `positions` (cursors, order, holes), `frames` (records from a frame),
`adapter` (the socket's lifecycle: open steps, timers, close).
"""

from leaseworker.protocol.adapter import ConfigError
from leaseworker.protocol.generic.adapter import GenericProtocol, GenericSocket
from leaseworker.protocol.generic.config import parse_config
from leaseworker.protocol.generic.model import GenericConfig, references_of
from leaseworker.protocol.generic.templates import redact_url

__all__ = [
    "ConfigError",
    "GenericConfig",
    "GenericProtocol",
    "GenericSocket",
    "parse_config",
    "redact_url",
    "references_of",
]
