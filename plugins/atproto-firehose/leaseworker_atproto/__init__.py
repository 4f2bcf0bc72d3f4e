"""A leaseworker protocol plugin: the atproto firehose (`atproto-firehose/1`), see README.md.

The entry point `leaseworker.protocols` / `atproto-firehose/1` names `factory`.
"""

from leaseworker_atproto.protocol import NAME, FirehoseAdapter, FirehoseConfig, FirehoseProtocol, factory

__all__ = ["NAME", "FirehoseAdapter", "FirehoseConfig", "FirehoseProtocol", "factory"]
