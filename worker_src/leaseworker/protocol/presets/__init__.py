"""Shipped presets: real feeds as `generic/1` configs with parameters (docs/design.md §4.2 "Presets").

A preset is data, not code (STYLE.md 17): one YAML file beside this module per feed, holding

    description: one paragraph: the feed, what it can and cannot detect
    docs: [the public documentation it was modelled on]
    params:
      NAME:
        help: one line
        required: false        # default false; a required param has no default
        default: "..."         # a string, or a list for a list param
        list: false            # true: comma-separated on the CLI (`--param symbols=A,B`)
        url: join              # list params in connect.url: `join` or `repeat` (see below)
        separator: ","         # `join`: between the elements in connect.url
        secret: false          # true: the value must be a reference, never the secret itself
        pattern: "regex"       # optional: every value (each element of a list) must match
    config: { a generic/1 config with {{param:NAME}} placeholders }

`expand(name, params)` substitutes the placeholders and returns the generic/1 config (a dict);
the CLI stores the preset's name beside it for display. The rules, kept simple on purpose:

- Every preset takes `url`: the endpoint (scheme, host, port, path) that the preset's own query
  or path parts are appended to, so `url=ws://127.0.0.1:9000/subscribe` points any preset at a
  mirror or a test server. It must be `ws://` or `wss://`. If it carries its own query, the
  preset's `?` after `{{param:url}}` becomes `&`.
- In JSON values: a string that is exactly `"{{param:NAME}}"` becomes the parameter's value: a
  JSON array for a list param, a string otherwise. A placeholder inside a longer string is
  replaced by the text (list elements joined with `,`).
- In `connect.url`: a list param written as a whole query pair, `KEY={{param:NAME}}`, expands
  by its `url` style: `repeat` gives `KEY=a&KEY=b` (Jetstream's wantedCollections), `join`
  gives `KEY=a<separator>b` (Binance's `streams=a/b`). An empty list drops the pair. Every
  element and every string value is percent-encoded (the separator is not); `url` is
  inserted as given.
- Secret params (`secret: true`: Alpaca's key and secret, Home Assistant's token) take only a
  reference, `{{secret:NAME#KEY}}` (NAME a secret's name or ARN) or `{{env:NAME}}`, which is kept
  as is: the worker resolves it when a socket connects. A literal is refused, since the config
  is stored in the table and shown by `connections show`.
- No other value may contain `{{` or `}}`: a symbol cannot smuggle a template into the config.
- An unknown, a missing required, or a malformed parameter is a ValueError of one line that
  names it.

The generic/1 templates (`{{cursor}}`, `{{#cursor}}…{{/cursor}}`, `{{msg_id}}`, …) are left for
the adapter to render at connect time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Final, Literal
from urllib.parse import quote

import yaml

__all__ = ["Param", "Preset", "expand", "load", "names"]

_PLACEHOLDER: Final = re.compile(r"\{\{param:([A-Za-z_][A-Za-z0-9_]*)\}\}")
_WHOLE: Final = re.compile(r"\{\{param:([A-Za-z_][A-Za-z0-9_]*)\}\}\Z")
# A query pair whose whole value is one placeholder: `?KEY={{param:NAME}}` or `&KEY=…`.
# The pair may also follow the end of a template section (`{{/cursor}}KEY=…`).
_QUERY_PAIR: Final = re.compile(
    r"([?&]|\{\{/[a-z_]+\}\})([A-Za-z0-9_.~-]+)=\{\{param:([A-Za-z_][A-Za-z0-9_]*)\}\}"
)
_SECTION_END_AMP: Final = re.compile(r"(\{\{/[a-z_]+\}\})&")
# References the worker resolves at connect time (leaseworker.secret_references): a Secrets Manager name
# or ARN with `#KEY` (the templates' own rule, generic/templates.py); or an environment variable.
_REFERENCE: Final = re.compile(
    r"\{\{(?:secret:[A-Za-z0-9/_+=.@:-]{1,2048}#[^{}#\s]{1,256}|env:[A-Za-z_][A-Za-z0-9_]*)\}\}\Z"
)
_NAME: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_PARAM_KEYS: Final = frozenset(
    {"help", "required", "default", "list", "url", "separator", "secret", "pattern"}
)
_SPEC_KEYS: Final = frozenset({"description", "docs", "params", "config"})
URL_PARAM: Final = "url"


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    help: str
    required: bool = False
    default: str | tuple[str, ...] | None = None
    list: bool = False
    url: Literal["join", "repeat"] = "join"
    separator: str = ","
    secret: bool = False
    pattern: re.Pattern[str] | None = None


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    description: str
    docs: tuple[str, ...]
    params: Mapping[str, Param]
    config: Mapping[str, Any]


def names() -> list[str]:
    """The shipped presets' names, sorted."""
    root = resources.files(__package__)
    return sorted(
        entry.name.removesuffix(".yaml")
        for entry in root.iterdir()
        if entry.name.endswith(".yaml") and _NAME.fullmatch(entry.name.removesuffix(".yaml"))
    )


@cache
def load(name: str) -> Preset:
    """The preset `name`, parsed and checked (ValueError naming it if there is none)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name not in names():
        raise ValueError(f"unknown preset {name!r}; one of: {', '.join(names())}")
    text = resources.files(__package__).joinpath(f"{name}.yaml").read_text(encoding="utf-8")
    return _parse(name, yaml.safe_load(text))


def expand(name: str, params: Mapping[str, str]) -> dict[str, Any]:
    """The generic/1 config of preset `name` with `params` substituted (CLI strings: a list
    param is comma-separated). Raises ValueError with one line naming the parameter."""
    preset = load(name)
    values = _values(preset, params)
    config = _substitute(preset.config, values, preset, path=())
    assert isinstance(config, dict)
    return config


# ------------------------------------------------------------------------------- parameters


def _values(preset: Preset, given: Mapping[str, str]) -> dict[str, str | tuple[str, ...]]:
    for key in given:
        if key not in preset.params:
            known = ", ".join(sorted(preset.params))
            raise ValueError(f"preset {preset.name!r} has no parameter {key!r}; it takes: {known}")
    values: dict[str, str | tuple[str, ...]] = {}
    for param in preset.params.values():
        raw = given.get(param.name)
        if raw is None:
            if param.required:
                raise ValueError(f"preset {preset.name!r} needs parameter {param.name!r}: {param.help}")
            assert param.default is not None
            values[param.name] = param.default
            continue
        if not isinstance(raw, str):
            raise ValueError(f"parameter {param.name!r}: give a string, got {type(raw).__name__}")
        values[param.name] = _check(param, raw)
    return values


def _check(param: Param, raw: str) -> str | tuple[str, ...]:
    if param.secret:
        if not _REFERENCE.match(raw.strip()):
            raise ValueError(
                f"parameter {param.name!r} is a secret: give a reference, {{{{secret:NAME#KEY}}}} or "
                f"{{{{env:NAME}}}}, not the value itself (the config is stored in the table)"
            )
        return raw.strip()
    items = [item.strip() for item in raw.split(",")] if param.list else [raw.strip()]
    if param.list:
        items = [item for item in items if item]
    for item in items:
        if "{{" in item or "}}" in item:
            raise ValueError(
                f"parameter {param.name!r}: '{{{{' and '}}}}' are not allowed in a value "
                "(only secret parameters take {{secret:…}} or {{env:…}})"
            )
        if any(ord(char) < 0x20 or ord(char) == 0x7F for char in item):
            raise ValueError(f"parameter {param.name!r}: control characters are not allowed")
        if param.pattern is not None and not param.pattern.fullmatch(item):
            rule = param.pattern.pattern
            raise ValueError(f"parameter {param.name!r}: {item[:80]!r} does not match {rule}")
    if param.name == URL_PARAM:
        value = items[0]
        if not re.match(r"wss?://[^/?#\s]+", value):
            raise ValueError(f"parameter 'url': {value[:80]!r} is not a ws:// or wss:// URL")
        return value
    return tuple(items) if param.list else items[0]


# ----------------------------------------------------------------------------- substitution


def _substitute(
    node: Any, values: Mapping[str, str | tuple[str, ...]], preset: Preset, path: tuple[str, ...]
) -> Any:
    if isinstance(node, dict):
        return {key: _substitute(value, values, preset, (*path, key)) for key, value in node.items()}
    if isinstance(node, list):
        return [_substitute(value, values, preset, path) for value in node]
    if not isinstance(node, str):
        return node
    if path == ("connect", "url"):
        return _render_url(node, values, preset)
    whole = _WHOLE.match(node)
    if whole:
        value = values[whole.group(1)]
        return list(value) if isinstance(value, tuple) else value
    return _PLACEHOLDER.sub(lambda m: _text(values[m.group(1)]), node)


def _text(value: str | tuple[str, ...]) -> str:
    return ",".join(value) if isinstance(value, tuple) else value


def _render_url(template: str, values: Mapping[str, str | tuple[str, ...]], preset: Preset) -> str:
    def pair(match: re.Match[str]) -> str:
        lead, key, name = match.group(1), match.group(2), match.group(3)
        param = preset.params[name]
        value = values[name]
        if not isinstance(value, tuple):
            return f"{lead}{key}={_encode(param, value)}"
        if not value:
            return lead  # the pair goes; a stray `?&` or `&&` is tidied below
        if param.url == "repeat":
            return lead + "&".join(f"{key}={_encode(param, item)}" for item in value)
        return f"{lead}{key}={param.separator.join(_encode(param, item) for item in value)}"

    rendered = _QUERY_PAIR.sub(pair, template)

    def other(match: re.Match[str]) -> str:
        param = preset.params[match.group(1)]
        value = values[param.name]
        if param.name == URL_PARAM:
            assert isinstance(value, str)
            return value
        if isinstance(value, tuple):
            return param.separator.join(_encode(param, item) for item in value)
        return _encode(param, value)

    # `{{param:url}}?…` with a url that has its own query: continue it with `&`.
    url_value = values.get(URL_PARAM)
    if isinstance(url_value, str) and "?" in url_value:
        rendered = rendered.replace("{{param:url}}?", "{{param:url}}&")
    rendered = _PLACEHOLDER.sub(other, rendered)
    while "?&" in rendered or "&&" in rendered:
        rendered = rendered.replace("?&", "?").replace("&&", "&")
    rendered = _SECTION_END_AMP.sub(r"\1", rendered)
    return rendered.rstrip("&?") if not rendered.endswith("}}") else rendered


def _encode(param: Param, value: str) -> str:
    if param.secret:
        return value  # a reference: the worker renders (and encodes) it at connect time
    return quote(value, safe="@:*!$'()")


# ---------------------------------------------------------------------------------- parsing


def _parse(name: str, spec: Any) -> Preset:
    where = f"preset {name!r}"
    if not isinstance(spec, dict) or not _SPEC_KEYS.issuperset(spec) or "config" not in spec:
        raise ValueError(f"{where}: a mapping of {', '.join(sorted(_SPEC_KEYS))} with a config")
    description = spec.get("description")
    docs = spec.get("docs", [])
    raw_params = spec.get("params", {})
    config = spec["config"]
    if not isinstance(description, str) or not description.strip():
        raise ValueError(f"{where}: needs a description")
    if not isinstance(docs, list) or not all(isinstance(doc, str) for doc in docs):
        raise ValueError(f"{where}: docs is a list of URLs")
    if not isinstance(raw_params, dict) or URL_PARAM not in raw_params:
        raise ValueError(f"{where}: params is a mapping and takes 'url'")
    if not isinstance(config, dict):
        raise ValueError(f"{where}: config is a generic/1 config mapping")
    params = {key: _parse_param(where, key, value) for key, value in raw_params.items()}
    for used in _placeholders(config):
        if used not in params:
            raise ValueError(f"{where}: config names {{{{param:{used}}}}}, which is not a parameter")
    return Preset(name, " ".join(description.split()), tuple(docs), params, config)


def _parse_param(where: str, name: str, spec: Any) -> Param:
    if not (isinstance(spec, dict) and _PARAM_KEYS.issuperset(spec) and isinstance(spec.get("help"), str)):
        raise ValueError(f"{where}: parameter {name!r} is a mapping of {', '.join(sorted(_PARAM_KEYS))}")
    is_list = bool(spec.get("list", False))
    required = bool(spec.get("required", False))
    default = spec.get("default")
    if required == (default is not None):
        raise ValueError(f"{where}: parameter {name!r} needs a default or required: true (not both)")
    if default is not None:
        if is_list and not (isinstance(default, list) and all(isinstance(d, str) for d in default)):
            raise ValueError(f"{where}: parameter {name!r}: a list's default is a list of strings")
        if not is_list and not isinstance(default, str):
            raise ValueError(f"{where}: parameter {name!r}: the default is a string")
    url_style = spec.get("url", "join")
    if url_style not in ("join", "repeat"):
        raise ValueError(f"{where}: parameter {name!r}: url is join or repeat")
    pattern = spec.get("pattern")
    return Param(
        name=name,
        help=" ".join(spec["help"].split()),
        required=required,
        default=tuple(default) if isinstance(default, list) else default,
        list=is_list,
        url=url_style,
        separator=str(spec.get("separator", ",")),
        secret=bool(spec.get("secret", False)),
        pattern=re.compile(pattern) if isinstance(pattern, str) else None,
    )


def _placeholders(node: Any) -> set[str]:
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if isinstance(key, str) and "{{param:" in key:
                    raise ValueError(f"placeholders are not allowed in keys ({key!r})")
                stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            found.update(_PLACEHOLDER.findall(item))
    return found
