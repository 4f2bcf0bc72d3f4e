"""Table-driven tests of the `atproto-firehose/1` adapter: frames in, actions out, no socket."""

from __future__ import annotations

import base64
import random
from dataclasses import dataclass, field
from typing import Any

import cbor2
import pytest
from leaseworker_atproto import FirehoseProtocol, factory
from leaseworker_atproto.frames import Link, encode_frame, error_frame, message_frame
from leaseworker_atproto.protocol import parse_config, url_with_cursor

from leaseworker.protocol.adapter import (
    Action,
    ConfigError,
    Dropped,
    Emit,
    Fail,
    Gap,
    Ready,
    Reconnect,
    Resume,
    SocketContext,
)
from leaseworker.protocol.registry import ProtocolSpec

URL = "wss://bsky.network/xrpc/com.atproto.sync.subscribeRepos"
CID = "bafyreie5cvv4h45feadgeuwhbcutmh6t2ceseocckahdoe6uat64zmz454"
WALL = 1_700_000_000_000


def protocol(config: dict[str, Any] | None = None, url: str = URL) -> FirehoseProtocol:
    return factory(ProtocolSpec(name="atproto-firehose/1", ws_url=url, config=config))


def context(cursor: Any = None, reason: Any = "reconnect", at_ms: int | None = WALL - 5000) -> SocketContext:
    return SocketContext(
        connection_id="c1", epoch=3, worker_id="w1", resume=Resume(cursor=cursor, at_ms=at_ms, reason=reason)
    )


def commit(seq: int, **extra: Any) -> bytes:
    return message_frame(
        "#commit",
        {"seq": seq, "repo": "did:plc:abc", "commit": Link.parse(CID), "blocks": b"\x00car", **extra},
    )


def frame(t: str, body: dict[str, Any]) -> bytes:
    return message_frame(t, body)


def raw_cbor(header: Any, body: Any) -> bytes:
    return cbor2.dumps(header) + cbor2.dumps(body)


@dataclass
class Case:
    name: str
    frames: list[bytes | str]
    expect: list[Action | type[Action]]  # a type: any action of that type
    cursor: Any = 10
    config: dict[str, Any] = field(default_factory=dict)


CASES = [
    Case("a message is delivered, with its t", [commit(11)], [Emit]),
    Case("a seq jump is no gap", [commit(11), commit(500)], [Emit, Emit]),
    Case("a seq at the cursor is a replay", [commit(10)], [Dropped("replay")]),
    Case(
        "a seq below the last is a replay",
        [commit(12), commit(11), commit(12)],
        [Emit, *[Dropped("replay")] * 2],
    ),
    Case(
        "identity, account and sync carry seqs too",
        [
            frame("#identity", {"seq": 11, "did": "did:plc:x", "time": "t"}),
            frame("#account", {"seq": 12, "did": "did:plc:x", "time": "t", "active": True}),
            frame("#sync", {"seq": 13, "did": "did:plc:x", "blocks": b"", "rev": "r", "time": "t"}),
        ],
        [Emit, Emit, Emit],
    ),
    Case("an unknown t with a seq is delivered", [frame("#future", {"seq": 11})], [Emit]),
    Case("an unknown t without a seq is ignored", [frame("#future", {"x": 1})], []),
    Case("an unknown op is ignored", [encode_frame({"op": 2, "t": "#commit"}, {"seq": 11})], []),
    Case(
        "OutdatedCursor is a cursor_too_old gap, once",
        [frame("#info", {"name": "OutdatedCursor"}), frame("#info", {"name": "OutdatedCursor"}), commit(3)],
        [
            Gap(reason="cursor_too_old", since_ms=WALL - 5000, until_ms=WALL, from_cursor=10),
            Dropped("replay"),
        ],
    ),
    Case(
        "another #info is delivered as data",
        [frame("#info", {"name": "Maintenance", "message": "soon"})],
        [Emit],
    ),
    Case(
        "FutureCursor fails the connection",
        [error_frame("FutureCursor", "Cursor in the future."), commit(11)],
        [Fail],
    ),
    Case("ConsumerTooSlow reconnects", [error_frame("ConsumerTooSlow")], [Reconnect]),
    Case("another error reconnects", [error_frame("InternalServerError", "boom")], [Reconnect]),
    Case("an error without a name reconnects", [encode_frame({"op": -1}, {"message": "?"})], [Reconnect]),
    Case("a text frame is raw", ['{"seq": 11}'], [Emit]),
    Case("garbage is raw", [b"\xff\xfe\x00"], [Emit]),
    Case("an empty frame is raw", [b""], [Emit]),
    Case("a header alone is raw", [cbor2.dumps({"op": 1, "t": "#commit"})], [Emit]),
    Case("three objects are raw", [commit(11) + b"\x00"], [Emit]),
    Case("a truncated frame is raw", [commit(11)[:-3]], [Emit]),
    Case("a header that is no map is raw", [raw_cbor([1], {"seq": 11})], [Emit]),
    Case("an op that is no integer is raw", [raw_cbor({"op": True, "t": "#commit"}, {"seq": 11})], [Emit]),
    Case("op 1 without t is raw", [raw_cbor({"op": 1}, {"seq": 11})], [Emit]),
    Case("a payload that is no map is raw", [raw_cbor({"op": 1, "t": "#commit"}, [11])], [Emit]),
    Case("a commit without seq is raw", [frame("#commit", {"repo": "x"})], [Emit]),
    Case("a bool seq is raw", [frame("#commit", {"seq": True})], [Emit]),
    Case("a string seq is raw", [frame("#commit", {"seq": "11"})], [Emit]),
    Case("seq 0 is raw", [frame("#commit", {"seq": 0})], [Emit]),
    Case("a negative seq is raw", [frame("#commit", {"seq": -4})], [Emit]),
    Case("a non-string key is raw", [raw_cbor({"op": 1, "t": "#commit"}, {"seq": 11, 7: 1})], [Emit]),
    Case(
        "another tag is raw",
        [raw_cbor({"op": 1, "t": "#commit"}, {"seq": 11, "x": cbor2.CBORTag(99, 1)})],
        [Emit],
    ),
    Case(
        "a CID tag on a string is raw",
        [raw_cbor({"op": 1, "t": "#commit"}, {"seq": 11, "x": cbor2.CBORTag(42, "b")})],
        [Emit],
    ),
    Case(
        "a datetime tag is raw",
        [raw_cbor({"op": 1, "t": "#commit"}, {"seq": 11, "x": cbor2.CBORTag(1, 0)})],
        [Emit],
    ),
    Case("NaN is raw", [raw_cbor({"op": 1, "t": "#commit"}, {"seq": 11, "x": float("nan")})], [Emit]),
    Case(
        "undefined is raw", [raw_cbor({"op": 1, "t": "#commit"}, {"seq": 11, "x": cbor2.undefined})], [Emit]
    ),
    Case(
        "indefinite lengths are raw",
        [cbor2.dumps({"op": 1, "t": "#commit"}) + b"\xbf\x63seq\x0b\xff"],
        [Emit],
    ),
    Case(
        "duplicate keys are raw",
        [cbor2.dumps({"op": 1, "t": "#commit"}) + b"\xa2\x63seq\x0b\x63seq\x0c"],
        [Emit],
    ),
    Case("bad UTF-8 is raw", [cbor2.dumps({"op": 1, "t": "#commit"}) + b"\xa1\x63seq\x62\xff\xfe"], [Emit]),
    Case(
        "deep nesting is raw",
        [cbor2.dumps({"op": 1, "t": "#commit"}) + b"\xa2\x63seq\x0b\x61x" + b"\x81" * 5000 + b"\x00"],
        [Emit],
    ),
    Case("on_undecodable fail", [b"\xff"], [Fail], config={"on_undecodable": "fail"}),
    Case(
        "on_undecodable reconnect", [b"\xff", commit(11)], [Reconnect], config={"on_undecodable": "reconnect"}
    ),
    Case("after an error frame nothing more", [error_frame("ConsumerTooSlow"), commit(11)], [Reconnect]),
]


def _matches(action: Action, expected: Action | type[Action]) -> bool:
    if isinstance(expected, type):
        return isinstance(action, expected)
    return action == expected


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_frames(case: Case) -> None:
    adapter = protocol(case.config).adapter(context(case.cursor), now=0.0)
    assert adapter.on_open(0.0, WALL) == [Ready()]
    actions: list[Action] = []
    for item in case.frames:
        actions.extend(adapter.on_frame(item, 1.0, WALL))
    assert len(actions) == len(case.expect), actions
    for action, expected in zip(actions, case.expect, strict=True):
        assert _matches(action, expected), (action, expected)
    # Every raw record carries the frame, base64, and the error; its position is the last seq.
    for action, item in zip(actions, case.frames, strict=False):
        if isinstance(action, Emit) and action.kind == "raw":
            sent = item.encode() if isinstance(item, str) else item
            assert base64.b64decode(action.data["frame_base64"]) == sent
            assert action.data["error"]
            assert action.cursor == action.checkpoint == case.cursor


def test_a_commit_becomes_json_safe_data() -> None:
    adapter = protocol().adapter(context(10), now=0.0)
    adapter.on_open(0.0, WALL)
    ops = [{"action": "create", "path": "app.bsky.feed.post/3l", "cid": Link.parse(CID)}]
    [emit] = adapter.on_frame(commit(11, ops=ops, since=None, tooBig=False), 1.0, WALL)
    assert emit == Emit(
        data={
            "t": "#commit",
            "seq": 11,
            "repo": "did:plc:abc",
            "commit": {"$link": CID},
            "blocks": {"$bytes": base64.b64encode(b"\x00car").decode()},
            "ops": [{"action": "create", "path": "app.bsky.feed.post/3l", "cid": {"$link": CID}}],
            "since": None,
            "tooBig": False,
        },
        cursor=11,
        checkpoint=11,
    )


def test_another_info_keeps_the_position() -> None:
    adapter = protocol().adapter(context(10), now=0.0)
    [emit] = adapter.on_frame(frame("#info", {"name": "Maintenance"}), 1.0, WALL)
    assert emit == Emit(data={"t": "#info", "name": "Maintenance"}, cursor=10, checkpoint=10)


@pytest.mark.parametrize(
    ("config", "cursor", "expect_url", "expect_open"),
    [
        ({}, None, URL, [Gap(reason="reconnect", since_ms=WALL - 5000, until_ms=WALL), Ready()]),
        ({}, 42, URL + "?cursor=42", [Ready()]),
        ({}, "42", URL + "?cursor=42", [Ready()]),
        ({"start": "oldest"}, None, URL + "?cursor=0", [Ready()]),
        ({"start": "oldest"}, 7, URL + "?cursor=7", [Ready()]),
    ],
)
def test_connect(config: dict[str, Any], cursor: Any, expect_url: str, expect_open: list[Action]) -> None:
    adapter = protocol(config).adapter(context(cursor), now=0.0)
    request = adapter.connect_request()
    assert request.url == expect_url
    assert request.max_frame_bytes == 5 * 1024 * 1024
    assert adapter.on_open(0.0, WALL) == expect_open


def test_the_first_socket_marks_where_the_live_stream_starts() -> None:
    adapter = protocol().adapter(context(None, reason="connect", at_ms=None), now=0.0)
    assert adapter.on_open(0.0, WALL) == [Gap(reason="connect", until_ms=WALL), Ready()]


@pytest.mark.parametrize("cursor", [{"a": 1}, -1, "x1", 1.5, True])
def test_a_checkpoint_that_is_no_seq_fails(cursor: Any) -> None:
    adapter = protocol().adapter(context(cursor), now=0.0)
    assert "cursor" not in adapter.connect_request().url
    [fail] = adapter.on_open(0.0, WALL)
    assert isinstance(fail, Fail)
    assert "not a firehose seq" in fail.reason


def test_outdated_cursor_after_cursor_0_is_no_gap() -> None:
    adapter = protocol({"start": "oldest"}).adapter(context(None), now=0.0)
    assert adapter.on_frame(frame("#info", {"name": "OutdatedCursor"}), 1.0, WALL) == []


def test_future_cursor_names_the_cursor() -> None:
    adapter = protocol().adapter(context(99), now=0.0)
    [fail] = adapter.on_frame(error_frame("FutureCursor", "Cursor in the future."), 1.0, WALL)
    assert isinstance(fail, Fail)
    assert "99" in fail.reason
    assert "Cursor in the future." in fail.reason


def test_errors_reconnect_as_errors() -> None:
    adapter = protocol().adapter(context(9), now=0.0)
    [action] = adapter.on_frame(error_frame("ConsumerTooSlow", "Stream consumer too slow"), 1.0, WALL)
    assert action == Reconnect("ConsumerTooSlow: Stream consumer too slow", kind="error")
    adapter = protocol().adapter(context(9), now=0.0)
    [action] = adapter.on_frame(error_frame("RateLimitExceeded"), 1.0, WALL)
    assert action == Reconnect("error frame RateLimitExceeded", kind="error")


def test_close_reconnects() -> None:
    adapter = protocol().adapter(context(9), now=0.0)
    [action] = adapter.on_close(1006, "", WALL)
    assert isinstance(action, Reconnect)
    assert action.kind == "closed"
    assert adapter.on_close(None, "", WALL) == []  # the socket has already ended


def test_idle_timer() -> None:
    adapter = protocol({"idle_timeout_s": 30}).adapter(context(9), now=100.0)
    adapter.on_open(100.0, WALL)
    assert adapter.next_timer() == 130.0
    adapter.on_frame(commit(10), 120.0, WALL)
    assert adapter.next_timer() == 150.0
    assert adapter.on_timer(149.0, WALL) == []
    [action] = adapter.on_timer(150.0, WALL)
    assert action == Reconnect("no frame for 30 s", kind="closed", next_open="idle")
    assert adapter.next_timer() is None
    assert protocol().adapter(context(9), now=0.0).next_timer() is None


def test_random_bytes_never_raise() -> None:
    rng = random.Random(7)
    valid = commit(11)
    for _ in range(3000):
        adapter = protocol().adapter(context(10), now=0.0)
        if rng.random() < 0.5:
            data = rng.randbytes(rng.randint(0, 64))
        else:  # a valid frame with a few bytes changed
            mutated = bytearray(valid)
            for _ in range(rng.randint(1, 4)):
                mutated[rng.randrange(len(mutated))] = rng.randrange(256)
            data = bytes(mutated)
        for action in adapter.on_frame(data, 1.0, WALL):
            assert isinstance(action, Emit | Dropped | Gap | Reconnect | Fail)


@pytest.mark.parametrize(
    ("config", "path"),
    [
        ({"nope": 1}, "nope"),
        ({"protocol": "generic/1"}, "protocol"),
        ({"max_frame_bytes": 10}, "max_frame_bytes"),
        ({"max_frame_bytes": "5MiB"}, "max_frame_bytes"),
        ({"start": "beginning"}, "start"),
        ({"idle_timeout_s": 0}, "idle_timeout_s"),
        ({"idle_timeout_s": True}, "idle_timeout_s"),
        ({"on_undecodable": "drop"}, "on_undecodable"),
    ],
)
def test_bad_config(config: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(config)
    assert raised.value.path == path


@pytest.mark.parametrize("url", ["https://bsky.network/x", "wss://", "bsky.network", "wss://h/x#frag"])
def test_bad_url(url: str) -> None:
    with pytest.raises(ConfigError) as raised:
        protocol(url=url)
    assert raised.value.path == "ws_url"


def test_config_defaults_and_protocol_key() -> None:
    assert parse_config(None) == parse_config({"protocol": "atproto-firehose/1"})
    config = parse_config(
        {"max_frame_bytes": 2**20, "start": "oldest", "idle_timeout_s": 5, "on_undecodable": "fail"}
    )
    assert (config.max_frame_bytes, config.start, config.idle_timeout_s, config.on_undecodable) == (
        2**20,
        "oldest",
        5.0,
        "fail",
    )


def test_url_cursor_replaces_and_display_redacts() -> None:
    url = url_with_cursor("wss://u:p@relay.example/xrpc/x?cursor=1&token=s3cret", 77)
    assert url == "wss://u:p@relay.example/xrpc/x?token=s3cret&cursor=77"
    request = protocol(url="wss://u:p@relay.example/xrpc/x?token=s3cret").adapter(context(77), now=0.0)
    shown = request.connect_request().display_url
    assert "s3cret" not in shown
    assert "u:p" not in shown
    assert shown == "wss://relay.example/xrpc/x?token=***&cursor=77"


def test_protocol_basics() -> None:
    built = protocol()
    assert built.name == "atproto-firehose/1"
    assert built.references() == frozenset()
    assert built.seq_base(-1) == 0
    assert built.seq_base(41) == 42


def test_link_round_trip() -> None:
    assert Link.parse(CID).text() == CID
    with pytest.raises(ValueError, match="base32"):
        Link.parse("Qmabc")
