"""generic/1 config validation: one-line errors naming the field's path and the rule, and the
published JSON Schema agreeing with the validator."""

from __future__ import annotations

import copy
import json
import math
from importlib import resources
from typing import Any

import pytest

from leaseworker.protocol.generic import ConfigError, GenericConfig, parse_config, references_of
from leaseworker.protocol.generic.model import BudgetConfig, ExpectStep, SendStep

URL = "wss://feed.example/ws"

# Realistic, complete configs (shaped after the feeds docs/design.md §4.2 names).
JETSTREAM: dict[str, Any] = {
    "protocol": "generic/1",
    "connect": {
        "url": "wss://jetstream2.us-east.bsky.network/subscribe?wantedCollections=app.bsky.feed.post"
        "{{#cursor}}&cursor={{cursor}}{{/cursor}}",
        "compression": "none",
    },
    "cursor": {"path": "/time_us", "order": "monotonic", "resume": {"in": "url", "inclusive": True}},
    "keepalive": {"idle_timeout_s": 60},
}
COINBASE: dict[str, Any] = {
    "connect": {"url": "wss://ws-feed.exchange.coinbase.com"},
    "open": [
        {"send": {"type": "subscribe", "product_ids": ["BTC-USD"], "channels": ["matches", "heartbeat"]}},
        {"expect": {"match": {"/type": "subscriptions"}, "fail": {"/type": "error"}, "refusal": "error"}},
    ],
    "frames": {
        "classify": [
            {"when": {"/type": "heartbeat"}, "action": "heartbeat", "cursor": "/last_trade_id"},
            {"when": {"/type": "error"}, "action": "error", "message": "/message"},
        ]
    },
    "cursor": {"path": "/trade_id", "key": "/product_id", "order": "strict", "resume": {"in": "none"}},
    "keepalive": {"ping_interval_s": None, "idle_timeout_s": 10},
}
BINANCE: dict[str, Any] = {
    "connect": {
        "url": "wss://stream.binance.com:9443/stream?streams=btcusdt@depth@100ms",
        "max_frame_bytes": 65536,
    },
    "frames": {"unwrap": "/data", "classify": [{"when": {"/id": 1}, "action": "ignore"}]},
    "cursor": {"path": "/u", "key": "/s", "order": "monotonic"},
    "gaps": {"first": "/U", "last": "/u"},
    "lifetime": {"max_age_s": 82800},
    "budget": {"count": 300, "seconds": 300},
}
ALPACA: dict[str, Any] = {
    "connect": {"url": "wss://stream.data.alpaca.markets/v2/iex", "headers": {"User-Agent": "leaseworker"}},
    "open": [
        {"expect": {"match": {"/0/T": "success", "/0/msg": "connected"}}},
        {"send": {"action": "auth", "key": "{{secret:alpaca#key}}", "secret": "{{secret:alpaca#secret}}"}},
        {"expect": {"match": {"/0/msg": "authenticated"}, "fail": {"/0/T": "error"}, "timeout_s": 5}},
        {"send": {"action": "subscribe", "trades": ["AAPL"]}},
    ],
    "frames": {
        "split": "",
        "classify": [
            {
                "when": {"/0/T": "error", "/0/code": 406},
                "action": "error",
                "message": "/0/msg",
                "refusal": "limit",
            },
            {"when": {"/0/T": "subscription"}, "action": "ignore"},
        ],
    },
    "dedup_id": "/i",
    "keepalive": {"app_ping": {"every_s": 30, "send": "ping {{msg_id}} {{env:PING_TAG}}"}},
}
VALID = {
    "jetstream": JETSTREAM,
    "coinbase": COINBASE,
    "binance": BINANCE,
    "alpaca": ALPACA,
    "minimal": {"connect": {"url": URL}},
}


def with_(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `base` with the member at dotted `path` set (or deleted when value is DELETE)."""
    config = copy.deepcopy(base)
    *parents, last = path.split(".")
    node: Any = config
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if value is DELETE:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return config


DELETE = object()
MIN: dict[str, Any] = {"connect": {"url": URL}}

# (config, the error's path, a fragment of its rule)
INVALID: list[tuple[dict[str, Any], str, str]] = [
    ({}, "connect", "is required"),
    ({"connect": {"url": URL}, "conect": {}}, "conect", "unknown key"),
    ({"connect": {"url": URL}, "protocol": "seqfeed/1"}, "protocol", "must be 'generic/1'"),
    (with_(MIN, "connect.url", "https://x"), "connect.url", "ws:// or wss://"),
    (with_(MIN, "connect.url", 5), "connect.url", "template string"),
    (with_(MIN, "connect.url", "wss://x/{{curser}}"), "connect.url", "unknown template tag"),
    (with_(MIN, "connect.url", "wss://x/{{#cursor}}a"), "connect.url", "never closed"),
    (with_(MIN, "connect.url", "wss://x/{{/cursor}}"), "connect.url", "closes no open section"),
    (with_(MIN, "connect.url", "wss://x/{{msg_id}}"), "connect.url", "only for sends"),
    (with_(MIN, "connect.url", "wss://x/{{env:1BAD}}"), "connect.url", "unknown template tag"),
    (with_(MIN, "connect.url", "wss://x/{{ oops"), "connect.url", "opens no valid tag"),
    (with_(MIN, "connect.hedaers", {}), "connect.hedaers", "unknown key"),
    (with_(MIN, "connect.headers", {"Bad Name": "x"}), 'connect.headers["Bad Name"]', "header name"),
    (with_(MIN, "connect.headers", {"X-A": 1}), 'connect.headers["X-A"]', "template string"),
    (with_(MIN, "connect.subprotocols", ["ok", "not ok"]), "connect.subprotocols[1]", "token"),
    (with_(MIN, "connect.compression", "gzip"), "connect.compression", "deflate, none"),
    (with_(MIN, "connect.max_frame_bytes", 0), "connect.max_frame_bytes", "between 1 and 16777216"),
    (with_(MIN, "connect.max_frame_bytes", 16 * 1024 * 1024 + 1), "connect.max_frame_bytes", "between"),
    (with_(MIN, "connect.max_frame_bytes", True), "connect.max_frame_bytes", "integer, not a boolean"),
    (with_(MIN, "connect.max_frame_bytes", 1.5), "connect.max_frame_bytes", "integer"),
    (with_(MIN, "open", {}), "open", "must be an array"),
    (with_(MIN, "open", [{}]), "open[0]", "exactly one of send, expect"),
    (with_(MIN, "open", [{"send": "a", "expect": {"match": {}}}]), "open[0]", "exactly one"),
    (with_(MIN, "open", [{"send": None}]), "open[0].send", "not null"),
    (with_(MIN, "open", [{"send": {"a": "{{nope}}"}}]), "open[0].send", "unknown template tag"),
    (with_(MIN, "open", [{"expect": {}}]), "open[0].expect.match", "is required"),
    (with_(MIN, "open", [{"expect": {"match": {"type": 1}}}]), "open[0].expect.match.type", "start with '/'"),
    (with_(MIN, "open", [{"expect": {"match": {"/a~2": 1}}}]), 'open[0].expect.match["/a~2"]', "'~'"),
    (with_(MIN, "open", [{"expect": {"match": {}, "fail": {}}}]), "open[0].expect.fail", "at least one"),
    (with_(MIN, "open", [{"expect": {"match": {}, "timeout_s": 0}}]), "open[0].expect.timeout_s", "> 0"),
    (
        with_(MIN, "open", [{"expect": {"match": {}, "timeout_s": float("nan")}}]),
        "open[0].expect.timeout_s",
        "finite",
    ),
    (
        with_(MIN, "open", [{"expect": {"match": {}, "timeout_s": float("inf")}}]),
        "open[0].expect.timeout_s",
        "finite",
    ),
    (
        with_(MIN, "open", [{"expect": {"match": {}, "timeout_s": True}}]),
        "open[0].expect.timeout_s",
        "boolean",
    ),
    (
        with_(MIN, "open", [{"expect": {"match": {}, "refusal": "nope"}}]),
        "open[0].expect.refusal",
        "auth, limit, error",
    ),
    (with_(MIN, "frames.decode", "xml"), "frames.decode", "json, text, binary_base64"),
    (with_(MIN, "frames.split", "data"), "frames.split", "start with '/'"),
    (with_(MIN, "frames.unwrap", 3), "frames.unwrap", "pointer string"),
    (with_(MIN, "frames.on_undecodable", "drop"), "frames.on_undecodable", "raw, fail"),
    (with_(MIN, "frames.classify", {}), "frames.classify", "must be an array"),
    (with_(MIN, "frames.classify", [{"when": {}}]), "frames.classify[0].action", "is required"),
    (
        with_(MIN, "frames.classify", [{"when": {}, "action": "ignore"}, {"when": {}, "action": "x"}, {}]),
        "frames.classify[1].action",
        "one of data, ignore, heartbeat, error, reconnect",
    ),
    (
        with_(
            MIN, "frames.classify", [{"when": {}, "action": "data"}] * 2 + [{"when": {}, "action": "drop"}]
        ),
        "frames.classify[2].action",
        "one of",
    ),
    (
        with_(MIN, "frames.classify", [{"when": {}, "action": "ignore", "message": "/m"}]),
        "frames.classify[0].message",
        "only for action error",
    ),
    (
        with_(MIN, "frames.classify", [{"when": {}, "action": "data", "cursor": "/c"}]),
        "frames.classify[0].cursor",
        "only for action heartbeat",
    ),
    (
        with_(MIN, "frames.classify", [{"when": [], "action": "data"}]),
        "frames.classify[0].when",
        "object of pointer",
    ),
    (
        with_(MIN, "frames.classify", [{"when": {}, "action": "data", "extra": 1}]),
        "frames.classify[0].extra",
        "unknown key",
    ),
    (with_(MIN, "cursor.order", "strict"), "cursor.order", "needs cursor.path"),
    (with_(MIN, "cursor", {"resume": {"in": "url"}}), "cursor.resume.in", "needs cursor.path"),
    (
        with_(MIN, "cursor", {"path": "/c", "resume": {"in": "url"}}),
        "cursor.resume.in",
        "connect.url has no {{cursor}}",
    ),
    (with_(MIN, "cursor", {"path": "/c", "resume": {"in": "open"}}), "cursor.resume.in", "no open send"),
    (
        with_(MIN, "cursor", {"path": "/c", "resume": {"inclusive": "yes"}}),
        "cursor.resume.inclusive",
        "boolean",
    ),
    (with_(MIN, "cursor", {"path": "/c", "resume": {"at": 1}}), "cursor.resume.at", "unknown key"),
    (with_(MIN, "cursor", {"path": "/c", "order": "fifo"}), "cursor.order", "strict, monotonic, none"),
    (with_(MIN, "gaps", {"first": "/U"}), "gaps.last", "is required"),
    (with_(MIN, "keepalive.ping_interval_s", -1), "keepalive.ping_interval_s", "> 0"),
    (with_(MIN, "keepalive.idle_timeout_s", "10"), "keepalive.idle_timeout_s", "number, not a string"),
    (with_(MIN, "keepalive.app_ping", {"every_s": 5}), "keepalive.app_ping.send", "is required"),
    (with_(MIN, "keepalive.app_ping", {"every_s": 0, "send": "p"}), "keepalive.app_ping.every_s", "> 0"),
    (with_(MIN, "lifetime", {"max_age_s": 1e9}), "lifetime.max_age_s", "<= 604800"),
    (with_(MIN, "lifetime", {"max_age": 5}), "lifetime.max_age", "unknown key"),
    (with_(MIN, "dedup_id", "id"), "dedup_id", "start with '/'"),
    (with_(MIN, "budget", {"count": 0, "seconds": 1}), "budget.count", "between 1"),
    (with_(MIN, "budget", {"count": 3}), "budget.seconds", "is required"),
    (with_(MIN, "budget", {"count": 3, "seconds": 1, "host": ""}), "budget.host", "non-empty string"),
    (with_(MIN, "budget", {"count": 3.5, "seconds": 1}), "budget.count", "integer"),
    ({"connect": {"url": URL}, "open": [{"send": "x" * 17000}]}, "", "at most 16384"),
]


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_configs_parse(name: str) -> None:
    config = parse_config(VALID[name])
    assert isinstance(config, GenericConfig)
    assert parse_config(json.dumps(VALID[name])) == config  # JSON text is accepted as well


@pytest.mark.parametrize(
    ("config", "path", "rule"), INVALID, ids=[f"{i}:{case[1]}" for i, case in enumerate(INVALID)]
)
def test_invalid_configs_name_path_and_rule(config: dict[str, Any], path: str, rule: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(config)
    assert caught.value.path == path
    assert rule in caught.value.rule
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith(path or "<config>")


def test_defaults() -> None:
    config = parse_config(MIN)
    assert config.connect.compression is True
    assert config.connect.max_frame_bytes == 1024 * 1024
    assert (config.keepalive.ping_interval_s, config.keepalive.ping_timeout_s) == (20.0, 20.0)
    assert config.keepalive.idle_timeout_s is None
    assert config.frames.decode == "json"
    assert config.frames.on_undecodable == "raw"
    assert config.cursor.order == "none"
    assert config.cursor.resume_in == "none"
    assert not config.cursor.replayable
    assert config.open == ()
    assert config.max_age_s is None
    assert config.budget is None


def test_parsed_sections() -> None:
    alpaca = parse_config(ALPACA)
    assert [type(step) for step in alpaca.open] == [ExpectStep, SendStep, ExpectStep, SendStep]
    first = alpaca.open[0]
    assert isinstance(first, ExpectStep)
    assert (first.timeout_s, first.refusal) == (10.0, "auth")
    assert alpaca.frames.split is not None and alpaca.frames.split.tokens == ()
    coinbase = parse_config(COINBASE)
    assert coinbase.keepalive.ping_interval_s is None  # explicit null disables
    assert coinbase.frames.classify[0].cursor is not None
    binance = parse_config(BINANCE)
    assert binance.budget is not None and binance.budget.count == 300
    assert binance.max_age_s == 82800.0
    assert parse_config(with_(MIN, "budget", {"count": 3.0, "seconds": 1})).budget == BudgetConfig(3, 1.0)


def test_strict_json_text() -> None:
    for text, rule in (
        ('{"connect": {"url": "wss://x"}, "keepalive": {"idle_timeout_s": NaN}}', "not strict JSON"),
        ('{"connect": {"url": "wss://x"}, "keepalive": {"idle_timeout_s": 1e999}}', "not strict JSON"),
        ("[" * 100000, "nested too deeply"),
        ("{", "not strict JSON"),
    ):
        with pytest.raises(ConfigError, match=rule):
            parse_config(text)
    with pytest.raises(ConfigError, match="must be an object"):
        parse_config("[]")


def test_not_json_values_are_refused() -> None:
    deep: Any = "x"
    for _ in range(40):
        deep = [deep]
    with pytest.raises(ConfigError, match="nests deeper"):
        parse_config({"connect": {"url": URL}, "open": [{"send": deep}]})
    with pytest.raises(ConfigError, match="not a JSON value"):
        parse_config({"connect": {"url": URL}, "open": [{"send": {"a": {1, 2}}}]})
    with pytest.raises(ConfigError, match="keys must be strings"):
        parse_config({"connect": {"url": URL}, "open": [{"send": {1: "a"}}]})


def test_references() -> None:
    assert references_of(parse_config(ALPACA)) == {
        "secret:alpaca#key",
        "secret:alpaca#secret",
        "env:PING_TAG",
    }
    headers = with_(MIN, "connect.headers", {"Authorization": "Bearer {{secret:ha/token#token}}"})
    assert references_of(parse_config(with_(headers, "connect.url", "wss://x/{{env:REGION}}"))) == {
        "secret:ha/token#token",
        "env:REGION",
    }
    assert references_of(parse_config(JETSTREAM)) == frozenset()
    arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:feeds/alpaca-AbCdEf"
    by_arn = with_(MIN, "connect.headers", {"X-Key": f"{{{{secret:{arn}#key}}}}"})
    assert references_of(parse_config(by_arn)) == {f"secret:{arn}#key"}


# ------------------------------------------------------------------- the published schema


def _schema() -> dict[str, Any]:
    text = (
        resources.files("leaseworker.protocol.generic").joinpath("generic-1.schema.json").read_text("utf-8")
    )
    schema = json.loads(text)
    assert isinstance(schema, dict)
    return schema


def test_schema_shape() -> None:
    schema = _schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["connect"]
    assert set(schema["properties"]) == {
        "protocol",
        "connect",
        "open",
        "frames",
        "cursor",
        "gaps",
        "keepalive",
        "lifetime",
        "dedup_id",
        "budget",
    }


# What a schema cannot say (template syntax, cross-section rules, the size limit, pointers in
# `cursor`'s cross-check): only the validator refuses these.
VALIDATOR_ONLY = (
    "unknown template tag",
    "never closed",
    "closes no open section",
    "only for sends",
    "opens no valid tag",
    "has no {{cursor}}",
    "no open send",
    "at most 16384",
    "not null",
)


def test_schema_and_validator_agree() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(_schema())
    validator.check_schema(_schema())
    for name, config in VALID.items():
        errors = [error.message for error in validator.iter_errors(config)]
        assert not errors, (name, errors)
    checked = 0
    for config, path, rule in INVALID:
        if any(fragment in rule for fragment in VALIDATOR_ONLY) or path == "":
            continue
        if any(isinstance(v, float) and not math.isfinite(v) for v in _leaves(config)):
            continue  # NaN and infinity are not JSON: no schema sees them
        assert not validator.is_valid(config), (path, rule)
        checked += 1
    assert checked > 50


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]
