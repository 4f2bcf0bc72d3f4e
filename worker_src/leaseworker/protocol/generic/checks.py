"""The small checks `generic/1` config validation is built from: each raises ConfigError with
the field's JSON path (`frames.classify[2].action`) and the rule it broke, in one line."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from leaseworker.protocol.adapter import ConfigError
from leaseworker.protocol.generic.model import Table
from leaseworker.protocol.generic.pointers import Pointer, PointerError
from leaseworker.protocol.generic.templates import SendTemplate, Template, TemplateError

T = TypeVar("T")
MAX_SECONDS: Final = 7 * 24 * 3600.0  # a week: no timer of a feed's config is longer
MAX_CONFIG_DEPTH: Final = 32

_IDENT: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
TOKEN: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token


def at(path: str, key: str | int) -> str:
    """The JSON path of a member: `a.b`, `a[2]`, `a["/type"]`."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _IDENT.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key, ensure_ascii=False)[:80]}]"


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__


def obj(value: Any, path: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(path, f"must be an object, not {type_name(value)}")
    for key in value:
        if key not in allowed:
            raise ConfigError(at(path, str(key)), f"unknown key (allowed: {', '.join(allowed)})")
    for key in required:
        if key not in value:
            raise ConfigError(at(path, key), "is required")
    return value


def array(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise ConfigError(path, f"must be an array, not {type_name(value)}")
    return value


def choice(value: Any, path: str, choices: tuple[str, ...]) -> Any:
    if not isinstance(value, str) or value not in choices:
        shown = json.dumps(value)[:40] if _jsonable(value) else type_name(value)
        raise ConfigError(path, f"must be one of {', '.join(choices)}, not {shown}")
    return value


def boolean(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(path, f"must be a boolean, not {type_name(value)}")
    return value


def string(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(path, f"must be a non-empty string, not {type_name(value)}")
    return value


def seconds(value: Any, path: str) -> float:
    """A finite number of seconds > 0 (never a boolean, NaN or infinity)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(path, f"must be a number, not {type_name(value)}")
    if not math.isfinite(value) or not value > 0 or value > MAX_SECONDS:
        raise ConfigError(path, f"must be a finite number > 0 and <= {MAX_SECONDS:g}")
    return float(value)


def optional_seconds(value: Any, path: str) -> float | None:
    """Seconds, or null (explicitly off)."""
    return None if value is None else seconds(value, path)


def integer(value: Any, path: str, low: int, high: int) -> int:
    # 3.0 is an integer to JSON Schema (and to YAML and JSON writers that only have floats).
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(path, f"must be an integer, not {type_name(value)}")
    if not low <= value <= high:
        raise ConfigError(path, f"must be between {low} and {high}")
    return value


def optional(
    section: Mapping[str, Any], key: str, path: str, parse: Callable[[Any, str], T], default: T
) -> T:
    return parse(section[key], at(path, key)) if key in section else default


def pointer(value: Any, path: str) -> Pointer:
    if not isinstance(value, str):
        raise ConfigError(path, f"must be a JSON pointer string, not {type_name(value)}")
    try:
        return Pointer.parse(value)
    except PointerError as exc:
        raise ConfigError(path, str(exc)) from None


def template(value: Any, path: str) -> Template:
    if not isinstance(value, str):
        raise ConfigError(path, f"must be a template string, not {type_name(value)}")
    try:
        return Template.parse(value)
    except TemplateError as exc:
        raise ConfigError(path, str(exc)) from None


def send(value: Any, path: str) -> SendTemplate:
    if value is None:
        raise ConfigError(path, "must be a JSON value or text, not null")
    try:
        return SendTemplate.parse(value)
    except TemplateError as exc:
        raise ConfigError(path, str(exc)) from None


def table(value: Any, path: str, *, allow_empty: bool) -> Table:
    """`{pointer: value}`: all pairs must hold for a frame to match."""
    if not isinstance(value, dict):
        raise ConfigError(path, f"must be an object of pointer: value, not {type_name(value)}")
    if not value and not allow_empty:
        raise ConfigError(path, "must name at least one pointer")
    return tuple((pointer(key, at(path, key)), item) for key, item in value.items())


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not strict JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} overflows to infinity")
    return value


_DECODER: Final = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite)


def loads(text: str | bytes) -> Any:
    """A config's JSON text, strictly (no NaN or Infinity)."""
    try:
        source = text.decode("utf-8") if isinstance(text, bytes) else text
        return _DECODER.decode(source)
    except RecursionError:
        raise ConfigError("", "is nested too deeply") from None
    except ValueError as exc:
        raise ConfigError("", f"is not strict JSON ({exc})"[:200]) from None


def check_json(value: Any, path: str) -> int:
    """Refuse what is not a JSON value (NaN, infinity, non-string keys, other types) or nests
    deeper than MAX_CONFIG_DEPTH; return its size as compact UTF-8 JSON."""
    stack: list[tuple[Any, str, int]] = [(value, path, 1)]
    while stack:
        item, where, depth = stack.pop()
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(where, f"nests deeper than {MAX_CONFIG_DEPTH} levels")
        if isinstance(item, float) and not math.isfinite(item):
            raise ConfigError(where, "must be a finite number (no NaN or infinity)")
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise ConfigError(where, "object keys must be strings")
                stack.append((child, at(where, key), depth + 1))
        elif isinstance(item, list):
            stack.extend((child, at(where, index), depth + 1) for index, child in enumerate(item))
        elif not (item is None or isinstance(item, str | int | float | bool)):
            raise ConfigError(where, f"is not a JSON value ({type(item).__name__})")
    encoded = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return len(encoded.encode("utf-8", "surrogatepass"))


def _jsonable(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)
