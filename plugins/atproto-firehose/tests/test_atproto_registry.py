"""The worker finds `atproto-firehose/1` through the `leaseworker.protocols` entry point."""

from __future__ import annotations

from importlib.metadata import entry_points

import leaseworker_atproto
import pytest
from leaseworker_atproto.protocol import FirehoseProtocol

from leaseworker.protocol.adapter import ConfigError
from leaseworker.protocol.registry import ENTRY_POINT_GROUP, ProtocolSpec, build, known_protocols

URL = "wss://bsky.network/xrpc/com.atproto.sync.subscribeRepos"


def test_the_entry_point_names_the_factory() -> None:
    [point] = [point for point in entry_points(group=ENTRY_POINT_GROUP) if point.name == "atproto-firehose/1"]
    assert point.value == "leaseworker_atproto:factory"
    assert point.load() is leaseworker_atproto.factory


def test_build_loads_the_plugin() -> None:
    config = {"max_frame_bytes": 8 * 1024 * 1024, "start": "oldest"}
    built = build(ProtocolSpec(name="atproto-firehose/1", ws_url=URL, config=config))
    assert isinstance(built, FirehoseProtocol)
    assert built.name == "atproto-firehose/1"
    assert built.config.max_frame_bytes == 8 * 1024 * 1024
    assert "atproto-firehose/1" in known_protocols()


def test_build_without_config_takes_the_defaults() -> None:
    built = build(ProtocolSpec(name="atproto-firehose/1", ws_url=URL))
    assert isinstance(built, FirehoseProtocol)
    assert built.config.max_frame_bytes == 5 * 1024 * 1024


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (ProtocolSpec(name="atproto-firehose/1", ws_url=URL, config={"start": "later"}), "start: "),
        (ProtocolSpec(name="atproto-firehose/1", ws_url="http://x/y"), "ws_url: "),
    ],
)
def test_a_bad_config_is_one_config_error_line(spec: ProtocolSpec, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        build(spec)
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)
