"""RFC 6901 JSON pointers, and the JSON equality that `match`, `fail` and `when` tables use.

A pointer is parsed once, when the config is validated (`Pointer.parse` raises PointerError for
a malformed one), and resolved against every frame. Resolving never raises, whatever the frame
holds: a missing member, an index past the end, a member of a scalar or a wrong type along the
way all resolve to MISSING.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Final


class PointerError(ValueError):
    """A pointer that is not RFC 6901 syntax."""


class _Missing:
    """Nothing at the pointer (distinct from a JSON null)."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Final = _Missing()

# RFC 6901 §4: an array index is "0" or digits without a leading zero.
_INDEX = re.compile(r"0|[1-9][0-9]*")
_BAD_ESCAPE = re.compile(r"~(?![01])")


def _unescape(token: str) -> str:
    # Order matters (RFC 6901 §4): "~01" is "~1" unescaped, not "/".
    return token.replace("~1", "/").replace("~0", "~")


@dataclass(frozen=True, slots=True)
class Pointer:
    text: str
    tokens: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Pointer:
        if not isinstance(text, str):
            raise PointerError("a JSON pointer is a string")
        if text == "":
            return cls(text, ())
        if not text.startswith("/"):
            raise PointerError(f"JSON pointer {text[:60]!r} must be empty or start with '/'")
        if _BAD_ESCAPE.search(text):
            raise PointerError(f"JSON pointer {text[:60]!r}: '~' must be followed by 0 or 1")
        return cls(text, tuple(_unescape(token) for token in text[1:].split("/")))

    def resolve(self, document: Any) -> Any:
        """The value at this pointer, or MISSING. `""` is the whole document."""
        value = document
        for token in self.tokens:
            if isinstance(value, dict):
                value = value.get(token, MISSING)
                if value is MISSING:
                    return MISSING
            elif isinstance(value, list):
                # "-" (past the end) and anything that is not a canonical index point nowhere.
                if not _INDEX.fullmatch(token):
                    return MISSING
                index = int(token)
                if index >= len(value):
                    return MISSING
                value = value[index]
            else:
                return MISSING
        return value

    def __str__(self) -> str:
        return self.text


def resolve(document: Any, pointer: str) -> Any:
    """Resolve pointer text against a document (MISSING if nothing is there)."""
    return Pointer.parse(pointer).resolve(document)


def is_number(value: object) -> bool:
    """A JSON number: an int or a finite float, never a bool."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value)


def json_equal(left: Any, right: Any) -> bool:
    """JSON equality: 1 == 1.0, but true is not 1 and "1" is not 1; objects and arrays deeply.

    Iterative, so that comparing an absurdly deep frame cannot recurse."""
    stack: list[tuple[Any, Any]] = [(left, right)]
    while stack:
        a, b = stack.pop()
        if isinstance(a, bool) or isinstance(b, bool):
            if not (isinstance(a, bool) and isinstance(b, bool) and a == b):
                return False
        elif is_number(a) or is_number(b):
            if not (is_number(a) and is_number(b) and a == b):
                return False
        elif isinstance(a, dict):
            if not isinstance(b, dict) or a.keys() != b.keys():
                return False
            stack.extend((a[key], b[key]) for key in a)
        elif isinstance(a, list):
            if not isinstance(b, list) or len(a) != len(b):
                return False
            stack.extend(zip(a, b, strict=True))
        elif a is None or isinstance(a, str):
            if type(a) is not type(b) or a != b:
                return False
        else:  # not a JSON value (a NaN float, an object): never equal
            return False
    return True


def matches(document: Any, table: tuple[tuple[Pointer, Any], ...]) -> bool:
    """Every pointer of the table resolves to a JSON-equal value (an empty table matches all)."""
    for pointer, expected in table:
        found = pointer.resolve(document)
        if type(expected) is str:  # the usual `when` (`{"/type": "heartbeat"}`): no json_equal
            if type(found) is not str or found != expected:
                return False
        elif found is MISSING or not json_equal(found, expected):
            return False
    return True
