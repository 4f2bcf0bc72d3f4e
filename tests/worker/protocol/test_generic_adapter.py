"""generic/1 sockets against realistic frames of the feeds docs/design.md §4.2 names, on a fake clock
(plain floats for monotonic seconds, ints for wall-clock ms)."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

import pytest

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
    Rotate,
    Send,
    SocketAdapter,
    SocketContext,
    UpstreamProtocol,
)
from leaseworker.protocol.generic import GenericProtocol, GenericSocket
from tests.worker.protocol.test_generic_config import ALPACA, BINANCE, COINBASE, JETSTREAM

ALPACA_VALUES = {"secret:alpaca#key": "AKID", "secret:alpaca#secret": "s3cr&t", "env:PING_TAG": "t"}


def open_socket(
    config: dict[str, Any],
    resume: Resume | None = None,
    values: dict[str, str] | None = None,
    now: float = 0.0,
) -> GenericSocket:
    context = SocketContext("conn-1", 3, "worker-a", resume or Resume(), values or {})
    return GenericProtocol(config).adapter(context, now)


def frame(value: Any) -> str:
    return json.dumps(value)


def feed(sock: GenericSocket, frames: Sequence[Any], now: float = 1.0, wall_ms: int = 5000) -> list[Action]:
    actions: list[Action] = []
    for index, item in enumerate(frames):
        raw = item if isinstance(item, str | bytes) else frame(item)
        actions.extend(sock.on_frame(raw, now + index, wall_ms + index))
    return actions


def emitted(actions: Sequence[Action]) -> list[Any]:
    return [action.cursor for action in actions if isinstance(action, Emit)]


# ------------------------------------------------------------------------------- Jetstream


def jetstream_event(time_us: int, did: str = "did:plc:eyo2gzmcqp4y2nfqrgcvvdip") -> dict[str, Any]:
    return {
        "did": did,
        "time_us": time_us,
        "kind": "commit",
        "commit": {
            "rev": "3l3qo2vutsw2b",
            "operation": "create",
            "collection": "app.bsky.feed.post",
            "rkey": "3l3qo2vuowo2b",
            "record": {"$type": "app.bsky.feed.post", "text": "hello"},
            "cid": "bafy",
        },
    }


def test_jetstream_resumes_inclusively_from_the_url_cursor() -> None:
    resume = Resume(cursor=1725911162329308, seq=41, at_ms=1000, reason="takeover")
    sock = open_socket(JETSTREAM, resume)
    request = sock.connect_request()
    assert request.url.endswith("wantedCollections=app.bsky.feed.post&cursor=1725911162329308")
    assert request.display_url.endswith("wantedCollections=***&cursor=***")
    assert request.compression is False
    assert sock.on_open(0.0, 1000) == [Ready()]  # no open steps: ready at once
    actions = feed(
        sock,
        [
            jetstream_event(1725911162329308),
            jetstream_event(1725911162329400),
            jetstream_event(1725911162329399),
            jetstream_event(1725911162330000),
        ],
    )
    # The inclusive resume repeats the cursor's event (a replay), a late one is a replay too,
    # and a replayable feed gets no gap marker on takeover.
    assert [type(action) for action in actions] == [Dropped, Emit, Dropped, Emit]
    assert emitted(actions) == [1725911162329400, 1725911162330000]
    last = actions[-1]
    assert isinstance(last, Emit) and last.checkpoint == 1725911162330000 and last.key is None
    assert last.data["commit"]["record"]["text"] == "hello"


def test_jetstream_first_connect_has_no_cursor_param() -> None:
    sock = open_socket(JETSTREAM)
    assert sock.connect_request().url == (
        "wss://jetstream2.us-east.bsky.network/subscribe?wantedCollections=app.bsky.feed.post"
    )


def test_jetstream_idle_feed_reconnects_marked_idle() -> None:
    sock = open_socket(JETSTREAM)
    sock.on_open(100.0, 1)
    assert sock.next_timer() == 160.0
    assert sock.on_timer(130.0, 2) == []
    feed(sock, [jetstream_event(1)], now=150.0)
    assert sock.next_timer() == 210.0
    assert sock.on_timer(209.9, 3) == []
    assert sock.on_timer(210.0, 4) == [Reconnect("idle: no frame for 60 s", "closed", next_open="idle")]
    assert sock.next_timer() is None
    assert sock.on_frame(frame(jetstream_event(2)), 211.0, 5) == []  # ended: nothing more
    assert sock.on_close(1000, "bye", 6) == []


# -------------------------------------------------------------------------------- Coinbase


def match(trade_id: int, product: str = "BTC-USD", sequence: int = 50) -> dict[str, Any]:
    return {
        "type": "match",
        "trade_id": trade_id,
        "sequence": sequence + trade_id,
        "maker_order_id": "ac9",
        "taker_order_id": "9d1",
        "time": "2024-09-09T12:00:00.000000Z",
        "product_id": product,
        "size": "0.01",
        "price": "57000.00",
        "side": "sell",
    }


def heartbeat(last_trade_id: int, product: str = "BTC-USD") -> dict[str, Any]:
    return {
        "type": "heartbeat",
        "sequence": 90,
        "last_trade_id": last_trade_id,
        "product_id": product,
        "time": "2024-09-09T12:00:01.000000Z",
    }


SUBSCRIPTIONS = {"type": "subscriptions", "channels": [{"name": "matches", "product_ids": ["BTC-USD"]}]}


def test_coinbase_subscribes_and_holds_early_matches_until_ready() -> None:
    resume = Resume(cursor={"BTC-USD": 100, "ETH-USD": 7}, seq=9, at_ms=900, reason="reconnect")
    sock = open_socket(COINBASE, resume)
    assert sock.connect_request().ping_interval_s is None  # explicit null: no WebSocket pings
    opened = sock.on_open(0.0, 1000)
    assert len(opened) == 1 and isinstance(opened[0], Send)
    assert json.loads(opened[0].frame)["channels"] == ["matches", "heartbeat"]
    assert sock.next_timer() == 10.0  # the expect's timeout... before the idle timeout
    assert feed(sock, [match(101)], now=1.0, wall_ms=2000) == []  # held, not dropped
    actions = feed(sock, [SUBSCRIPTIONS], now=2.0, wall_ms=3000)
    # Coinbase cannot replay: the socket's marker goes before its first record, bounded by the
    # resume position and that record.
    assert actions == [
        Ready(),
        Gap(
            "reconnect",
            since_ms=900,
            until_ms=2000,
            from_cursor={"BTC-USD": 100, "ETH-USD": 7},
            to_cursor=101,
        ),
        Emit(match(101), 101, "BTC-USD", "data", {"BTC-USD": 101, "ETH-USD": 7}),
    ]


def test_coinbase_keyed_strict_gaps_are_marked_per_product() -> None:
    sock = open_socket(COINBASE)
    sock.on_open(0.0, 1000)
    feed(sock, [SUBSCRIPTIONS])
    actions = feed(
        sock,
        [match(5), match(40, "ETH-USD"), match(6), match(9), match(41, "ETH-USD"), match(9)],
        wall_ms=2000,
    )
    assert actions[0] == Gap("connect", None, 2000, None, 5)  # the very first socket
    assert actions[1:4] == [
        Emit(match(5), 5, "BTC-USD", "data", {"BTC-USD": 5}),
        Emit(match(40, "ETH-USD"), 40, "ETH-USD", "data", {"BTC-USD": 5, "ETH-USD": 40}),
        Emit(match(6), 6, "BTC-USD", "data", {"BTC-USD": 6, "ETH-USD": 40}),
    ]
    # 7 and 8 are lost and cannot be replayed: a keyed seq_gap from 6 (received at 2002) to 9.
    assert actions[4] == Gap(
        "seq_gap", since_ms=2002, until_ms=2003, from_cursor=6, to_cursor=9, key="BTC-USD"
    )
    assert emitted(actions[5:]) == [9, 41]
    assert actions[-1] == Dropped("replay")


def test_coinbase_heartbeat_reports_lost_trades() -> None:
    sock = open_socket(COINBASE)
    sock.on_open(0.0, 1000)
    feed(sock, [SUBSCRIPTIONS, match(5)])
    assert feed(sock, [heartbeat(5), heartbeat(4)], wall_ms=3000) == []  # up to date, or stale
    assert feed(sock, [heartbeat(8)], wall_ms=4000) == [Gap("seq_gap", 5001, 4000, 5, 8, "BTC-USD")]
    assert emitted(feed(sock, [match(9)])) == [9]  # counted from the heartbeat's position


def test_coinbase_error_frame_and_close() -> None:
    sock = open_socket(COINBASE)
    sock.on_open(0.0, 1000)
    feed(sock, [SUBSCRIPTIONS])
    error = {"type": "error", "message": "Failed to subscribe", "reason": "ZZZ-USD is not a valid product"}
    assert feed(sock, [error]) == [Reconnect("upstream error: Failed to subscribe", kind="error")]
    assert sock.on_close(1000, "", 1) == []


def test_coinbase_subscribe_refused_and_timeout() -> None:
    sock = open_socket(COINBASE)
    sock.on_open(0.0, 1000)
    refused = feed(sock, [{"type": "error", "message": "Authentication Failed"}])
    assert refused == [
        Reconnect('error refused: {"type":"error","message":"Authentication Failed"}', "error")
    ]
    late = open_socket(COINBASE)
    late.on_open(0.0, 1000)
    assert late.on_timer(9.9, 1) == []
    assert late.on_timer(10.0, 2) == [Reconnect("open step 1 timed out after 10 s", "protocol")]


# --------------------------------------------------------------------------------- Binance


def depth(
    first: int, last: int, stream: str = "bnbbtc@depth@100ms", symbol: str = "BNBBTC"
) -> dict[str, Any]:
    return {
        "stream": stream,
        "data": {
            "e": "depthUpdate",
            "E": 1672515782136,
            "s": symbol,
            "U": first,
            "u": last,
            "b": [["0.0024", "10"]],
            "a": [["0.0026", "100"]],
        },
    }


def test_binance_unwraps_and_marks_range_gaps() -> None:
    resume = Resume(cursor={"BNBBTC": 160}, seq=3, at_ms=500, reason="takeover")
    sock = open_socket(BINANCE, resume)
    assert sock.connect_request().max_frame_bytes == 65536
    assert sock.on_open(0.0, 1000) == [Ready()]
    actions = feed(
        sock,
        [
            {"result": None, "id": 1},
            depth(150, 160),
            depth(155, 170),
            depth(171, 180),
            depth(185, 190),
            depth(186, 189),
        ],
        wall_ms=2000,
    )
    assert actions == [
        Dropped("replay"),  # all of it was delivered before the takeover
        # the socket's marker covers what the takeover lost; the overlapping first update is kept
        Gap("takeover", since_ms=500, until_ms=2002, from_cursor={"BNBBTC": 160}, to_cursor=170),
        Emit(depth(155, 170)["data"], 170, "BNBBTC", "data", {"BNBBTC": 170}),
        Emit(depth(171, 180)["data"], 180, "BNBBTC", "data", {"BNBBTC": 180}),
        Gap("seq_gap", since_ms=2003, until_ms=2004, from_cursor=180, to_cursor=185, key="BNBBTC"),
        Emit(depth(185, 190)["data"], 190, "BNBBTC", "data", {"BNBBTC": 190}),
        Dropped("replay"),
    ]


def test_binance_frame_without_data_is_delivered_raw() -> None:
    sock = open_socket(BINANCE)
    sock.on_open(0.0, 1000)
    actions = feed(sock, [{"stream": "x", "payload": 1}])
    assert isinstance(actions[1], Emit) and actions[1].kind == "raw"
    assert actions[1].data == {
        "frame": '{"stream":"x","payload":1}',
        "encoding": "text",
        "error": "frames.unwrap '/data' points at nothing",
    }


def test_binance_rotates_once_before_the_24h_cut() -> None:
    sock = open_socket(BINANCE)
    sock.on_open(1000.0, 1)
    assert sock.next_timer() == 1000.0 + 82800
    assert sock.on_timer(83799.0, 2) == []
    assert sock.on_timer(83800.0, 3) == [Rotate()]
    assert sock.next_timer() is None
    assert sock.on_timer(90000.0, 4) == []
    assert emitted(feed(sock, [depth(1, 2)])) == [2]  # still delivering until the session closes it


# ---------------------------------------------------------------------------------- Alpaca

CONNECTED = [{"T": "success", "msg": "connected"}]
AUTHENTICATED = [{"T": "success", "msg": "authenticated"}]


def trade(trade_id: int, symbol: str = "AAPL") -> dict[str, Any]:
    return {
        "T": "t",
        "S": symbol,
        "i": trade_id,
        "x": "V",
        "p": 126.55,
        "s": 1,
        "t": "2021-02-22T15:51:44.208Z",
        "c": ["@", "I"],
        "z": "C",
    }


def alpaca_ready() -> tuple[GenericSocket, list[Action]]:
    sock = open_socket(ALPACA, values=ALPACA_VALUES)
    actions = [*sock.on_open(0.0, 1000), *feed(sock, [CONNECTED]), *feed(sock, [AUTHENTICATED], now=2.0)]
    return sock, actions


def test_alpaca_authenticates_then_subscribes() -> None:
    sock, actions = alpaca_ready()
    request = sock.connect_request()
    assert request.headers == (("User-Agent", "leaseworker"),)
    sends = [json.loads(action.frame) for action in actions if isinstance(action, Send)]
    assert sends == [
        {"action": "auth", "key": "AKID", "secret": "s3cr&t"},
        {"action": "subscribe", "trades": ["AAPL"]},
    ]
    assert isinstance(actions[-1], Ready)
    assert sock.next_timer() == 32.0  # the app ping, 30 s after ready


def test_alpaca_splits_arrays_and_drops_duplicate_ids() -> None:
    sock, _ = alpaca_ready()
    actions = feed(sock, [[trade(1), trade(2, "MSFT")], [trade(2, "MSFT"), trade(3)]], wall_ms=7000)
    assert actions[0] == Gap("connect", None, 7000, None, None)
    assert [a.data["i"] for a in actions if isinstance(a, Emit)] == [1, 2, 3]
    assert actions.count(Dropped("duplicate")) == 1
    assert feed(sock, [[{"T": "subscription", "trades": ["AAPL"]}]]) == []
    not_array = feed(sock, [{"T": "t"}])
    assert isinstance(not_array[0], Emit) and not_array[0].kind == "raw"
    assert "is not an array" in not_array[0].data["error"]


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (
            [{"T": "error", "code": 402, "msg": "auth failed"}],
            Reconnect('auth refused: [{"T":"error","code":402,"msg":"auth failed"}]', "auth"),
        ),
        (
            [{"T": "error", "code": 406, "msg": "connection limit exceeded"}],
            Reconnect("upstream error: connection limit exceeded", "limit"),
        ),
    ],
)
def test_alpaca_refusals(reply: Any, expected: Reconnect) -> None:
    sock = open_socket(ALPACA, values=ALPACA_VALUES)
    sock.on_open(0.0, 1000)
    feed(sock, [CONNECTED])
    if expected.kind == "limit":  # the limit error comes once ready (it is a classify rule)
        feed(sock, [AUTHENTICATED])
    assert feed(sock, [reply]) == [expected]


def test_alpaca_auth_timeout_and_app_ping() -> None:
    sock = open_socket(ALPACA, values=ALPACA_VALUES)
    sock.on_open(0.0, 1000)
    feed(sock, [CONNECTED], now=1.0)
    assert sock.next_timer() == 6.0  # timeout_s 5 from the step's start
    assert sock.on_timer(6.0, 1) == [Reconnect("open step 2 timed out after 5 s", "protocol")]
    ready, _ = alpaca_ready()
    assert ready.on_timer(32.0, 2) == [Send("ping 3 t")]  # msg ids 1 and 2 went to the open sends
    assert ready.on_timer(62.0, 3) == [Send("ping 4 t")]


# ------------------------------------------------------------------- order rules, replayable

SEQ: dict[str, Any] = {
    "connect": {"url": "wss://feed.example/ws"},
    "open": [{"send": {"op": "subscribe", "after": "{{cursor}}", "id": "{{msg_id}}"}}],
    "cursor": {"path": "/seq", "order": "strict", "resume": {"in": "open", "inclusive": False}},
    "gaps": {"first": "/first", "last": "/seq"},
}


def test_strict_gap_on_a_replayable_feed_reconnects_without_marker() -> None:
    sock = open_socket(SEQ, Resume(cursor=5, seq=5, at_ms=10))
    assert sock.on_open(0.0, 0) == [Send('{"op":"subscribe","after":5,"id":1}'), Ready()]
    actions = feed(sock, [{"seq": 6}, {"seq": 8}, {"seq": 9}])
    assert actions == [Emit({"seq": 6}, 6, None, "data", 6), Reconnect("gap: expected 7, got 8", "protocol")]


def test_cursor_too_old_when_the_upstream_cannot_reach_back() -> None:
    sock = open_socket(SEQ, Resume(cursor=5, seq=5, at_ms=10))
    sock.on_open(0.0, 0)
    actions = feed(sock, [{"seq": 5}, {"seq": 20}, {"seq": 21}], wall_ms=100)
    assert actions == [
        Dropped("replay"),
        Gap("cursor_too_old", since_ms=10, until_ms=101, from_cursor=5, to_cursor=20),
        Emit({"seq": 20}, 20, None, "data", 20),
        Emit({"seq": 21}, 21, None, "data", 21),
    ]


def test_range_gap_on_a_replayable_feed_reconnects() -> None:
    config = copy.deepcopy(SEQ)
    config["cursor"]["order"] = "monotonic"
    sock = open_socket(config, Resume(cursor=5))
    sock.on_open(0.0, 0)
    actions = feed(sock, [{"first": 6, "seq": 9}, {"first": 10, "seq": 12}, {"first": 14, "seq": 15}])
    assert emitted(actions) == [9, 12]
    assert actions[-1] == Reconnect("gap: expected 13, got 14", "protocol")


def test_monotonic_string_cursors_and_no_order() -> None:
    config = {"connect": {"url": "wss://x"}, "cursor": {"path": "/id", "order": "monotonic"}}
    sock = open_socket(config)
    sock.on_open(0.0, 0)
    actions = feed(sock, [{"id": "2024-01-01"}, {"id": "2024-01-03"}, {"id": "2024-01-02"}, {"no": "cursor"}])
    assert [type(a) for a in actions] == [Gap, Emit, Emit, Dropped, Emit]
    assert actions[-1] == Emit({"no": "cursor"}, None, None, "data", "2024-01-03")
    config["cursor"]["order"] = "none"
    unordered = open_socket(config)
    unordered.on_open(0.0, 0)
    assert emitted(feed(unordered, [{"id": 3}, {"id": 1}, {"id": 1}])) == [3, 1, 1]


# ---------------------------------------------------------------------- frames and closes


def test_classify_actions() -> None:
    config = {
        "connect": {"url": "wss://x"},
        "frames": {
            "classify": [
                {"when": {"/op": 7}, "action": "reconnect"},
                {"when": {"/op": 11}, "action": "heartbeat"},
                {"when": {"/op": 9}, "action": "error", "refusal": "auth"},
                {"when": {"/op": 0}, "action": "data"},
                {"when": {}, "action": "ignore"},
            ]
        },
    }

    def run(value: Any) -> list[Action]:
        sock = open_socket(config)
        sock.on_open(0.0, 0)
        return feed(sock, [value])

    assert run({"op": 7}) == [Reconnect('upstream asked to reconnect: {"op":7}', "closed")]
    assert run({"op": 11}) == []
    assert run({"op": 9, "d": False}) == [Reconnect('upstream error: {"op":9,"d":false}', "auth")]
    assert emitted(run({"op": 0})) == [None]
    assert run({"op": 1}) == []


@pytest.mark.parametrize(
    ("decode", "frame_in", "expected"),
    [
        ("json", b'{"a":1}', {"a": 1}),  # JSON in a binary frame, valid UTF-8
        ("text", "hello\u2603", "hello\u2603"),
        ("binary_base64", b"\x00\xff", "AP8="),
        ("binary_base64", "hi", "aGk="),
    ],
)
def test_decodes(decode: str, frame_in: str | bytes, expected: Any) -> None:
    sock = open_socket({"connect": {"url": "wss://x"}, "frames": {"decode": decode}})
    sock.on_open(0.0, 0)
    actions = sock.on_frame(frame_in, 1.0, 1)
    assert isinstance(actions[-1], Emit) and actions[-1].data == expected and actions[-1].kind == "data"


@pytest.mark.parametrize(
    ("decode", "frame_in", "shown", "encoding", "error"),
    [
        ("json", '{"a": NaN}', '{"a": NaN}', "text", "not strict JSON"),
        ("json", '{"a": 1e999}', '{"a": 1e999}', "text", "overflows to infinity"),
        ("json", "[" * 200 + "]" * 200, "[" * 200 + "]" * 200, "text", "nested deeper than 128"),
        ("json", b"\xff{}", "/3t9", "base64", "not UTF-8"),
        ("text", b"abc", "YWJj", "base64", "where text was expected"),
        ("json", "x" * 70000, "x" * 1024, "text", "exceeds max_frame_bytes 65536"),
    ],
)
def test_undecodable_frames_are_delivered_raw(
    decode: str, frame_in: str | bytes, shown: str, encoding: str, error: str
) -> None:
    config = {"connect": {"url": "wss://x", "max_frame_bytes": 65536}, "frames": {"decode": decode}}
    sock = open_socket(config)
    sock.on_open(0.0, 0)
    actions = sock.on_frame(frame_in, 1.0, 1)
    raw = actions[-1]
    assert isinstance(raw, Emit) and raw.kind == "raw" and raw.cursor is None
    assert raw.data["frame"] == shown and raw.data["encoding"] == encoding and error in raw.data["error"]
    assert "\n" not in raw.data["error"]


def test_undecodable_frame_can_fail_the_connection() -> None:
    sock = open_socket({"connect": {"url": "wss://x"}, "frames": {"on_undecodable": "fail"}})
    sock.on_open(0.0, 0)
    actions = sock.on_frame("not json", 1.0, 1)
    assert len(actions) == 1 and isinstance(actions[0], Fail) and "not strict JSON" in actions[0].reason
    assert sock.on_frame("{}", 2.0, 2) == []


@pytest.mark.parametrize(
    ("code", "reason", "kind", "text"),
    [
        (1000, "bye", "closed", "upstream closed: code 1000 bye"),
        (1006, "", "closed", "upstream closed: code 1006"),
        (None, "", "closed", "upstream closed: no close frame"),
        (1008, "Invalid token", "auth", "upstream closed: code 1008 Invalid token"),
        (1008, "rate limit exceeded", "limit", "upstream closed: code 1008 rate limit exceeded"),
        (1008, "policy", "closed", "upstream closed: code 1008 policy"),
        (None, "HTTP 401", "auth", "upstream closed: HTTP 401"),
        (None, "server rejected WebSocket connection: HTTP 403", "auth", None),
        (None, "HTTP 429", "limit", None),
        (None, "HTTP 503", "closed", None),
        (1011, "line\nbreak", "closed", "upstream closed: code 1011 line break"),
    ],
)
def test_close_kinds(code: int | None, reason: str, kind: str, text: str | None) -> None:
    sock = open_socket({"connect": {"url": "wss://x"}})
    (closed,) = sock.on_close(code, reason, 1)
    assert isinstance(closed, Reconnect) and closed.kind == kind and closed.next_open == "reconnect"
    if text is not None:
        assert closed.reason == text


def test_protocol_surface() -> None:
    protocol = GenericProtocol(json.dumps(ALPACA))
    typed: UpstreamProtocol = protocol  # mypy checks that both halves match the interface
    socket_typed: SocketAdapter = open_socket(JETSTREAM)
    assert typed.name == "generic/1" and socket_typed.next_timer() is None
    assert protocol.name == "generic/1"
    assert protocol.seq_base(41) == 42
    assert protocol.references() == set(ALPACA_VALUES)
    with pytest.raises(ConfigError, match="env:PING_TAG has no value"):
        protocol.adapter(
            SocketContext("c", 1, "w", Resume(), {k: v for k, v in ALPACA_VALUES.items() if "env" not in k}),
            0.0,
        )
    request = open_socket(
        {
            "connect": {
                "url": "wss://x/{{connection_id}}?e={{epoch}}&k={{env:K}}",
                "subprotocols": ["v1.json"],
                "headers": {"Authorization": "Bearer {{env:K}}"},
            }
        },
        values={"env:K": "tok en"},
    ).connect_request()
    assert request.url == "wss://x/conn-1?e=3&k=tok%20en"
    assert request.display_url == "wss://x/conn-1?e=***&k=***"
    assert "tok" not in request.display_url
    assert request.headers == (("Authorization", "Bearer tok en"),)
    assert request.subprotocols == ("v1.json",)
    assert (request.ping_interval_s, request.ping_timeout_s, request.compression) == (20.0, 20.0, True)


def test_masked_secret_in_url_path() -> None:
    sock = open_socket(
        {"connect": {"url": "wss://x/{{secret:feed#token}}/ws"}}, values={"secret:feed#token": "hunter2"}
    )
    request = sock.connect_request()
    assert request.url == "wss://x/hunter2/ws" and request.display_url == "wss://x/***/ws"


def test_events_out_of_order_are_harmless() -> None:
    sock = open_socket({"connect": {"url": "wss://x"}, "open": [{"expect": {"match": {"/ok": True}}}]})
    assert sock.next_timer() is None and sock.on_timer(5.0, 1) == []
    assert sock.on_frame('{"early": 1}', 0.5, 1) == []  # before on_open: held
    sock.on_open(1.0, 2)
    assert sock.on_open(1.0, 2) == []
    actions = feed(sock, [{"ok": True}])
    assert Ready() in actions and {"early": 1} in [a.data for a in actions if isinstance(a, Emit)]
