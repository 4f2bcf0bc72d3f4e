"""Nothing an upstream sends makes a generic/1 socket raise (docs/design.md §4.4): seeded garbage
against every shape of config, in every state of the socket."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from leaseworker.protocol.adapter import (
    Action,
    Dropped,
    Emit,
    Fail,
    Gap,
    Ready,
    Reconnect,
    Resume,
    Rotate,
    Send,
)
from leaseworker.protocol.generic import GenericProtocol
from tests.worker.protocol.test_generic_adapter import ALPACA_VALUES, SEQ, open_socket
from tests.worker.protocol.test_generic_config import ALPACA, BINANCE, COINBASE, JETSTREAM

CONFIGS = {"jetstream": JETSTREAM, "coinbase": COINBASE, "binance": BINANCE, "alpaca": ALPACA, "seq": SEQ}
RESUMES = [
    Resume(),
    Resume(cursor=5, at_ms=1),
    Resume(cursor={"BTC-USD": 3, "x": [1]}),
    Resume(cursor=[1, {}]),
    Resume(cursor="abc", reason="takeover"),
    Resume(cursor=True),
]
ACTIONS = (Send, Emit, Gap, Ready, Reconnect, Fail, Dropped, Rotate)

TRICKY: list[str | bytes] = [
    "",
    " ",
    "null",
    "true",
    "0",
    "-0",
    "1e308",
    "1e999",
    "NaN",
    "-Infinity",
    '"\\ud800"',
    '["\\udfff"]',
    '{"a":"\\ud83d"}',
    "[" * 100_000,
    "{" * 5000,
    '{"a":' * 300 + "1" + "}" * 300,
    "[" * 127 + "]" * 127,
    "\ud800",
    "caf\udce9",
    b"",
    b"\x80",
    b"\xed\xa0\x80",
    b"\xff" * 10,
    b"[1,2]",
    "[]",
    "{}",
    "[[]]",
    '{"type":"match","trade_id":"7","product_id":["BTC"]}',
    '{"type":"match","trade_id":1.5,"product_id":null}',
    '{"type":"match","trade_id":true,"product_id":7}',
    '{"type":"heartbeat","last_trade_id":"x"}',
    '{"type":"heartbeat","last_trade_id":1e300,"product_id":{}}',
    '{"stream":1,"data":[]}',
    '{"stream":"s","data":{"U":"1","u":null,"s":5}}',
    '{"data":{"U":10,"u":5}}',
    '{"data":{"U":-1e20,"u":1e20}}',
    '[{"T":"error","code":"406"}]',
    '[{"T":"success","msg":"connected"}]',
    '[{"T":"success","msg":"authenticated"}]',
    '{"T":"t"}',
    '[1,null,"x",[]]',
    '{"did":1,"time_us":"1725911162329308"}',
    '{"time_us":{"$numberLong":"1"}}',
    '{"seq":"6"}',
    '{"seq":-1}',
    '{"seq":9007199254740993}',
    '{"seq":6,"first":"x"}',
    '{"i":{"a":[1]}}',
    "x" * (1024 * 1024 + 1),
]


def _random_frame(rng: random.Random) -> str | bytes:
    kind = rng.randrange(5)
    if kind == 0:
        return rng.randbytes(rng.randrange(64))
    if kind == 1:
        return "".join(
            chr(
                rng.choice(
                    [rng.randrange(0x20, 0x7F), rng.randrange(0xD800, 0xE000), rng.randrange(0x110000)]
                )
            )
            for _ in range(rng.randrange(32))
        )
    if kind == 2:
        return json.dumps(_random_json(rng, 4))
    if kind == 3:
        text = json.dumps(_random_json(rng, 4))
        cut = rng.randrange(len(text) + 1)
        return text[:cut] + rng.choice(["", "}", "]", ",", "\\", '"', "NaN"]) + text[cut:]
    return rng.choice(TRICKY)


def _random_json(rng: random.Random, depth: int) -> Any:
    keys = [
        "type",
        "trade_id",
        "product_id",
        "last_trade_id",
        "stream",
        "data",
        "U",
        "u",
        "s",
        "T",
        "msg",
        "code",
        "i",
        "seq",
        "first",
        "time_us",
        "did",
        "op",
        "id",
        "result",
        "message",
    ]
    choice = rng.randrange(8 if depth > 0 else 5)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([True, False])
    if choice == 2:
        return rng.choice([0, 1, -1, 5, 6, 7, 2**63, rng.randrange(-(10**6), 10**6), 1.5, -0.0, 1e300])
    if choice == 3:
        return rng.choice(
            [
                "",
                "match",
                "heartbeat",
                "error",
                "success",
                "connected",
                "authenticated",
                "subscription",
                "BTC-USD",
                "t",
                "\ud800",
                "x" * 50,
            ]
        )
    if choice == 4:
        return rng.choice(keys)
    if choice in (5, 6):
        return {rng.choice(keys): _random_json(rng, depth - 1) for _ in range(rng.randrange(5))}
    return [_random_json(rng, depth - 1) for _ in range(rng.randrange(4))]


def _check(actions: Any) -> None:
    assert isinstance(actions, list | tuple)
    for action in actions:
        assert isinstance(action, ACTIONS), action
        if isinstance(action, Emit):
            json.dumps(action.data)  # a strict JSON sink can write it (escaping lone surrogates)
            assert action.kind in ("data", "raw")
        if isinstance(action, Reconnect | Fail):
            assert "\n" not in action.reason


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_garbage_never_raises(name: str) -> None:
    rng = random.Random(f"generic/1 {name}")
    values = ALPACA_VALUES if name == "alpaca" else {}
    for round_ in range(30):
        sock = open_socket(CONFIGS[name], RESUMES[round_ % len(RESUMES)], values)
        now, wall = 0.0, 1_000
        sock.connect_request()
        actions: list[Action] = list(sock.on_open(now, wall))
        for _ in range(60):
            now += rng.choice([0.0, 0.5, 3.0, 40.0])
            wall += 1
            event = rng.randrange(10)
            if event == 0:
                actions = list(sock.on_timer(now, wall))
            elif event == 1 and rng.random() < 0.1:
                actions = list(
                    sock.on_close(
                        rng.choice([None, 1000, 1008, 1011]), rng.choice(["", "HTTP 401", "x"]), wall
                    )
                )
            else:
                actions = list(sock.on_frame(_random_frame(rng), now, wall))
            _check(actions)
            timer = sock.next_timer()
            assert timer is None or isinstance(timer, float)


@pytest.mark.parametrize("frame_in", TRICKY, ids=range(len(TRICKY)))
def test_tricky_frames_in_every_config(frame_in: str | bytes) -> None:
    for name, config in CONFIGS.items():
        values = ALPACA_VALUES if name == "alpaca" else {}
        for resume in RESUMES[:3]:
            sock = open_socket(config, resume, values)
            _check(sock.on_frame(frame_in, 0.0, 0))  # before open
            sock = open_socket(config, resume, values)
            _check(sock.on_open(0.0, 0))
            _check(sock.on_frame(frame_in, 1.0, 1))  # during open (or ready, without steps)
            _check(sock.on_frame(frame_in, 2.0, 2))


def test_huge_nesting_is_refused_without_recursion() -> None:
    sock = open_socket({"connect": {"url": "wss://x"}, "frames": {"split": "/a/0", "unwrap": "/b"}})
    sock.on_open(0.0, 0)
    for text in ("[" * 1_000_000, '{"a":' * 200_000 + "1" + "}" * 200_000):
        (raw,) = sock.on_frame(text, 1.0, 1)[-1:]
        assert isinstance(raw, Emit) and raw.kind == "raw"


def test_the_protocol_accepts_its_own_parsed_config() -> None:
    protocol = GenericProtocol(CONFIGS["seq"])
    assert GenericProtocol(protocol.config).config is protocol.config
