"""Durable, at-least-once sinks (docs/design.md §5), chosen with SINK."""

from leaseworker.sinks.base import Sink, SinkError
from leaseworker.sinks.factory import open_sink

__all__ = ["Sink", "SinkError", "open_sink"]
