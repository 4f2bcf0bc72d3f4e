"""Strict parsers for single context values, and the one-line `ConfigError` they raise.

`-c name=value` arrives as a string, cdk.json values arrive as JSON types: both are accepted
and parsed strictly (no floats for integers, no "yes" for booleans, no NaN for ratios).
"""

from __future__ import annotations

import math
import re

EMAIL_PATTERN = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
ACCOUNT_PATTERN = re.compile(r"[0-9]{12}")
REGION_PATTERN = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]")
NAMESPACE_PATTERN = re.compile(r"[A-Za-z0-9._/#:-]{1,255}")
INT_PATTERN = re.compile(r"[+-]?[0-9]+")
DECIMAL_PATTERN = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


class ConfigError(ValueError):
    """A context value broke a rule; str() is the one-line explanation."""

    def __init__(self, name: str, value: object, rule: str) -> None:
        super().__init__(f"invalid context {name}={value!r}: {rule}")
        self.name = name
        self.value = value
        self.rule = rule


def parse_int(name: str, raw: object) -> int:
    if isinstance(raw, bool):  # bool is an int subclass: `true` is not a number of seconds
        raise ConfigError(name, raw, "must be an integer")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and INT_PATTERN.fullmatch(raw.strip()):
        return int(raw.strip())
    raise ConfigError(name, raw, "must be an integer")


def parse_positive(name: str, raw: object) -> int:
    value = parse_int(name, raw)
    if value <= 0:
        raise ConfigError(name, raw, "must be > 0")
    return value


def parse_ratio(name: str, raw: object) -> float:
    """A number in 0..1; NaN, infinities and booleans are refused."""
    rule = "must be a number between 0 and 1"
    if isinstance(raw, bool):
        raise ConfigError(name, raw, rule)
    if isinstance(raw, int | float):
        value = float(raw)
    elif isinstance(raw, str) and DECIMAL_PATTERN.fullmatch(raw.strip()):
        value = float(raw.strip())
    else:
        raise ConfigError(name, raw, rule)
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ConfigError(name, raw, rule)
    return value


def parse_choice(name: str, raw: object, allowed: tuple[str, ...]) -> str:
    if isinstance(raw, str) and raw.strip() in allowed:
        return raw.strip()
    raise ConfigError(name, raw, f"must be one of {' | '.join(allowed)}")


def parse_pattern(name: str, raw: object, pattern: re.Pattern[str], rule: str) -> str:
    if isinstance(raw, str) and pattern.fullmatch(raw.strip()):
        return raw.strip()
    raise ConfigError(name, raw, rule)


def parse_optional_email(name: str, raw: object) -> str | None:
    if raw is None or (isinstance(raw, str) and raw.strip() == ""):
        return None
    return parse_pattern(name, raw, EMAIL_PATTERN, "must be an email address like ops@example.com")


def parse_bool(name: str, raw: object) -> bool:
    """`true` / `false` (JSON) or the same words from `-c`; nothing else (no 1, no "yes")."""
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise ConfigError(name, raw, "must be true or false")
