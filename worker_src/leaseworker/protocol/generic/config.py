"""The `generic/1` config (docs/design.md §4.2): a frozen typed model, validated with one-line errors.

`parse_config(obj)` takes the parsed JSON object (or its JSON text) and returns GenericConfig,
or raises ConfigError naming the field's JSON path (`frames.classify[2].action`) and the rule.
Unknown keys are refused at every level; a top-level `"protocol": "generic/1"` is the one extra
key allowed. The same shape is published as a JSON Schema (generic-1.schema.json, beside this
module); what a schema cannot say (template syntax, pointer cross-checks, the size limit) only
this validator checks.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Final, Literal

from leaseworker.protocol.adapter import ConfigError
from leaseworker.protocol.generic import checks as c
from leaseworker.protocol.generic.model import (
    DEFAULT_EXPECT_TIMEOUT_S,
    DEFAULT_PING_S,
    MAX_CONFIG_BYTES,
    NAME,
    Action,
    AppPing,
    BudgetConfig,
    ClassifyRule,
    ConnectConfig,
    CursorConfig,
    Decode,
    ExpectStep,
    FramesConfig,
    GapsConfig,
    GenericConfig,
    KeepaliveConfig,
    MiB,
    Order,
    Refusal,
    ResumeIn,
    SendStep,
)
from leaseworker.protocol.generic.templates import Template

# ----------------------------------------------------------------------------------- parsing

REFUSALS: Final = ("auth", "limit", "error")
ACTIONS: Final = ("data", "ignore", "heartbeat", "error", "reconnect")
_PING: Final[float | None] = DEFAULT_PING_S
_TOP: Final = (
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
)


PARSED_CONFIGS: Final = 1024  # validated configs kept (an LRU), shared by the sessions using one
_parsed: OrderedDict[str, GenericConfig] = OrderedDict()


def parse_config(value: Any) -> GenericConfig:
    """Validate a `generic/1` config: the parsed JSON object, or its JSON text.

    A GenericConfig is immutable, so the sessions of many connections with one config (a preset,
    a URL template per connection id) share one copy of it (about 2.5 KB each otherwise): the
    last PARSED_CONFIGS valid configs are kept by their canonical JSON. Errors are never kept."""
    if isinstance(value, str | bytes):
        value = c.loads(value)
    try:
        key = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):  # not plain JSON: validation says why
        return _parse(value)
    found = _parsed.get(key)
    if found is not None:
        _parsed.move_to_end(key)
        return found
    parsed = _parse(value)
    _parsed[key] = parsed
    if len(_parsed) > PARSED_CONFIGS:
        _parsed.popitem(last=False)
    return parsed


def _parse(value: Any) -> GenericConfig:
    top = c.obj(value, "", _TOP, required=("connect",))
    size = c.check_json(top, "")
    if size > MAX_CONFIG_BYTES:
        raise ConfigError("", f"is {size} bytes as JSON, at most {MAX_CONFIG_BYTES}")
    if "protocol" in top and top["protocol"] != NAME:
        raise ConfigError("protocol", f"must be {NAME!r} when present")
    config = GenericConfig(
        connect=_connect(top["connect"], "connect"),
        open=c.optional(top, "open", "", _open, ()),
        frames=c.optional(top, "frames", "", _frames, FramesConfig()),
        cursor=c.optional(top, "cursor", "", _cursor, CursorConfig()),
        gaps=c.optional(top, "gaps", "", _gaps, None),
        keepalive=c.optional(top, "keepalive", "", _keepalive, KeepaliveConfig()),
        max_age_s=c.optional(top, "lifetime", "", _lifetime, None),
        dedup_id=c.optional(top, "dedup_id", "", c.pointer, None),
        budget=c.optional(top, "budget", "", _budget, None),
    )
    _cross_check(config)
    return config


def _connect(value: Any, path: str) -> ConnectConfig:
    section = c.obj(
        value, path, ("url", "headers", "subprotocols", "compression", "max_frame_bytes"), ("url",)
    )
    url = c.template(section["url"], c.at(path, "url"))
    if not url.source.lower().startswith(("ws://", "wss://")):
        raise ConfigError(c.at(path, "url"), "must start with ws:// or wss://")
    if "msg_id" in url.names():
        raise ConfigError(c.at(path, "url"), "{{msg_id}} is only for sends")
    return ConnectConfig(
        url=url,
        headers=c.optional(section, "headers", path, _headers, ()),
        subprotocols=c.optional(section, "subprotocols", path, _subprotocols, ()),
        compression=c.optional(section, "compression", path, _compression, True),
        max_frame_bytes=c.optional(section, "max_frame_bytes", path, _frame_bytes, MiB),
    )


def _compression(value: Any, path: str) -> bool:
    return bool(c.choice(value, path, ("deflate", "none")) == "deflate")


def _frame_bytes(value: Any, path: str) -> int:
    return c.integer(value, path, 1, 16 * MiB)


def _headers(value: Any, path: str) -> tuple[tuple[str, Template], ...]:
    if not isinstance(value, dict):
        raise ConfigError(path, f"must be an object of name: template, not {c.type_name(value)}")
    headers = []
    for name, text in value.items():
        where = c.at(path, name)
        if not c.TOKEN.fullmatch(name):
            raise ConfigError(where, "is not a valid header name")
        template = c.template(text, where)
        if "msg_id" in template.names():
            raise ConfigError(where, "{{msg_id}} is only for sends")
        headers.append((name, template))
    return tuple(headers)


def _subprotocols(value: Any, path: str) -> tuple[str, ...]:
    items = c.array(value, path)
    for index, item in enumerate(items):
        if not isinstance(item, str) or not c.TOKEN.fullmatch(item):
            raise ConfigError(c.at(path, index), "must be a subprotocol token string")
    return tuple(items)


def _open(value: Any, path: str) -> tuple[SendStep | ExpectStep, ...]:
    steps: list[SendStep | ExpectStep] = []
    for index, item in enumerate(c.array(value, path)):
        where = c.at(path, index)
        step = c.obj(item, where, ("send", "expect"))
        if len(step) != 1:
            raise ConfigError(where, "must have exactly one of send, expect")
        if "send" in step:
            steps.append(SendStep(c.send(step["send"], c.at(where, "send"))))
        else:
            steps.append(_expect(step["expect"], c.at(where, "expect")))
    return tuple(steps)


def _expect(value: Any, path: str) -> ExpectStep:
    section = c.obj(value, path, ("match", "fail", "timeout_s", "refusal"), ("match",))
    return ExpectStep(
        match=c.table(section["match"], c.at(path, "match"), allow_empty=True),
        fail=c.table(section["fail"], c.at(path, "fail"), allow_empty=False) if "fail" in section else (),
        timeout_s=c.optional(section, "timeout_s", path, c.seconds, DEFAULT_EXPECT_TIMEOUT_S),
        refusal=c.optional(section, "refusal", path, _refusal, "auth"),
    )


def _refusal(value: Any, path: str) -> Refusal:
    result: Refusal = c.choice(value, path, REFUSALS)
    return result


def _frames(value: Any, path: str) -> FramesConfig:
    section = c.obj(value, path, ("decode", "split", "unwrap", "classify", "on_undecodable"))
    return FramesConfig(
        decode=c.optional(section, "decode", path, _decode, "json"),
        split=c.optional(section, "split", path, c.pointer, None),
        unwrap=c.optional(section, "unwrap", path, c.pointer, None),
        classify=c.optional(section, "classify", path, _classify, ()),
        on_undecodable=c.optional(section, "on_undecodable", path, _undecodable, "raw"),
    )


def _decode(value: Any, path: str) -> Decode:
    result: Decode = c.choice(value, path, ("json", "text", "binary_base64"))
    return result


def _undecodable(value: Any, path: str) -> Literal["raw", "fail"]:
    result: Literal["raw", "fail"] = c.choice(value, path, ("raw", "fail"))
    return result


def _classify(value: Any, path: str) -> tuple[ClassifyRule, ...]:
    rules: list[ClassifyRule] = []
    for index, item in enumerate(c.array(value, path)):
        where = c.at(path, index)
        rule = c.obj(item, where, ("when", "action", "message", "refusal", "cursor"), ("when", "action"))
        action: Action = c.choice(rule["action"], c.at(where, "action"), ACTIONS)
        for key, needs in (("message", "error"), ("refusal", "error"), ("cursor", "heartbeat")):
            if key in rule and action != needs:
                raise ConfigError(c.at(where, key), f"is only for action {needs}")
        rules.append(
            ClassifyRule(
                when=c.table(rule["when"], c.at(where, "when"), allow_empty=True),
                action=action,
                message=c.optional(rule, "message", where, c.pointer, None),
                refusal=c.optional(rule, "refusal", where, _refusal, "error"),
                cursor=c.optional(rule, "cursor", where, c.pointer, None),
            )
        )
    return tuple(rules)


def _cursor(value: Any, path: str) -> CursorConfig:
    section = c.obj(value, path, ("path", "order", "key", "resume"))
    where = c.at(path, "resume")
    resume = c.obj(section.get("resume", {}), where, ("in", "inclusive"))
    config = CursorConfig(
        path=c.optional(section, "path", path, c.pointer, None),
        order=c.optional(section, "order", path, _order, "none"),
        key=c.optional(section, "key", path, c.pointer, None),
        resume_in=c.optional(resume, "in", where, _resume_in, "none"),
        inclusive=c.optional(resume, "inclusive", where, c.boolean, False),
    )
    if config.path is None:
        if config.order != "none":
            raise ConfigError("cursor.order", "needs cursor.path")
        if config.resume_in != "none":
            raise ConfigError("cursor.resume.in", "needs cursor.path")
    return config


def _order(value: Any, path: str) -> Order:
    result: Order = c.choice(value, path, ("strict", "monotonic", "none"))
    return result


def _resume_in(value: Any, path: str) -> ResumeIn:
    result: ResumeIn = c.choice(value, path, ("url", "open", "none"))
    return result


def _gaps(value: Any, path: str) -> GapsConfig:
    section = c.obj(value, path, ("first", "last"), ("first", "last"))
    return GapsConfig(
        c.pointer(section["first"], f"{path}.first"), c.pointer(section["last"], f"{path}.last")
    )


def _keepalive(value: Any, path: str) -> KeepaliveConfig:
    section = c.obj(value, path, ("ping_interval_s", "ping_timeout_s", "idle_timeout_s", "app_ping"))
    app_ping = None
    if "app_ping" in section:
        where = f"{path}.app_ping"
        ping = c.obj(section["app_ping"], where, ("every_s", "send"), ("every_s", "send"))
        app_ping = AppPing(
            c.seconds(ping["every_s"], f"{where}.every_s"), c.send(ping["send"], f"{where}.send")
        )
    return KeepaliveConfig(
        ping_interval_s=c.optional(section, "ping_interval_s", path, c.optional_seconds, _PING),
        ping_timeout_s=c.optional(section, "ping_timeout_s", path, c.optional_seconds, _PING),
        idle_timeout_s=c.optional(section, "idle_timeout_s", path, c.optional_seconds, None),
        app_ping=app_ping,
    )


def _lifetime(value: Any, path: str) -> float | None:
    section = c.obj(value, path, ("max_age_s",))
    return c.optional(section, "max_age_s", path, c.optional_seconds, None)


def _budget(value: Any, path: str) -> BudgetConfig:
    section = c.obj(value, path, ("host", "count", "seconds"), ("count", "seconds"))
    return BudgetConfig(
        count=c.integer(section["count"], f"{path}.count", 1, 1_000_000),
        seconds=c.seconds(section["seconds"], f"{path}.seconds"),
        host=c.optional(section, "host", path, c.string, None),
    )


def _cross_check(config: GenericConfig) -> None:
    """Rules across sections: where the cursor goes on resume must hold a {{cursor}}."""
    if config.cursor.resume_in == "url" and "cursor" not in config.connect.url.names():
        raise ConfigError("cursor.resume.in", "is url, but connect.url has no {{cursor}}")
    if config.cursor.resume_in == "open" and not any(
        isinstance(step, SendStep) and "cursor" in step.send.names() for step in config.open
    ):
        raise ConfigError("cursor.resume.in", "is open, but no open send has a {{cursor}}")
