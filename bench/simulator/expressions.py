"""DynamoDB expressions, compiled once per text: conditions, key conditions, updates, projections.

Covers the grammar the lease stores send (comparisons, AND/OR/NOT, parentheses,
attribute_exists/attribute_not_exists/begins_with, BETWEEN; SET with if_not_exists and +/-,
REMOVE, ADD on numbers) with DynamoDB's typing rule: values of different types are never equal
and never ordered. Items are kept in wire form (`{"name": {"N": "3"}}`). Anything outside this
grammar raises `Unsupported`, so the simulator can never silently accept a request shape it does
not understand.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any

Item = dict[str, Any]
Values = Mapping[str, Any]
Names = Mapping[str, str]
Condition = Callable[[Item, Values, Names], bool]
Operand = Callable[[Item, Values, Names], Any]

_TOKEN = re.compile(r"\s*(<>|<=|>=|[=<>(),+\-]|[:#]?[A-Za-z_][A-Za-z0-9_]*)")
_COMPARATORS: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda a, b: a == b,
    "<>": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


class Unsupported(ValueError):
    """An expression outside the grammar the simulator implements."""


def tokens(text: str) -> list[str]:
    found: list[str] = []
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            if text[position:].strip():
                raise Unsupported(f"cannot parse {text[position:]!r} in {text!r}")
            break
        found.append(match.group(1))
        position = match.end()
    return found


def number(raw: str) -> int | Decimal:
    try:
        return int(raw)
    except ValueError:
        return Decimal(raw)


def comparable(value: Any) -> tuple[str, Any] | None:
    """(type, Python value) for ordering; None for a missing attribute."""
    if value is None:
        return None
    ((tag, inner),) = value.items()
    return (tag, number(inner)) if tag == "N" else (tag, inner)


def attribute_name(token: str, names: Names) -> str:
    if token.startswith("#"):
        if token not in names:
            raise Unsupported(f"{token} is not in ExpressionAttributeNames")
        return names[token]
    return token


@dataclass
class _Parser:
    items: list[str]
    at: int = 0

    def peek(self) -> str | None:
        return self.items[self.at] if self.at < len(self.items) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token.upper() != expected):
            raise Unsupported(f"expected {expected or 'a token'} at {token!r} in {' '.join(self.items)}")
        self.at += 1
        return token

    def done(self) -> None:
        if self.peek() is not None:
            raise Unsupported(f"unexpected {self.peek()!r} in {' '.join(self.items)}")

    # condition := disjunction
    def disjunction(self) -> Condition:
        parts = [self.conjunction()]
        while (self.peek() or "").upper() == "OR":
            self.take()
            parts.append(self.conjunction())
        return parts[0] if len(parts) == 1 else (lambda i, v, n: any(p(i, v, n) for p in parts))

    def conjunction(self) -> Condition:
        parts = [self.negation()]
        while (self.peek() or "").upper() == "AND":
            self.take()
            parts.append(self.negation())
        return parts[0] if len(parts) == 1 else (lambda i, v, n: all(p(i, v, n) for p in parts))

    def negation(self) -> Condition:
        if (self.peek() or "").upper() == "NOT":
            self.take()
            inner = self.negation()
            return lambda i, v, n: not inner(i, v, n)
        return self.primary()

    def primary(self) -> Condition:
        token = self.peek()
        if token == "(":
            self.take()
            inner = self.disjunction()
            self.take(")")
            return inner
        if token in ("attribute_exists", "attribute_not_exists", "begins_with"):
            return self.function()
        left = self.operand()
        operator = self.take()
        if operator.upper() == "BETWEEN":
            low = self.operand()
            self.take("AND")
            high = self.operand()
            return _between(left, low, high)
        if operator not in _COMPARATORS:
            raise Unsupported(f"comparator {operator!r}")
        return _compare(operator, left, self.operand())

    def function(self) -> Condition:
        name = self.take()
        self.take("(")
        path = self.take()
        if name == "begins_with":
            self.take(",")
            prefix = self.operand()
            self.take(")")
            return _begins_with(path, prefix)
        self.take(")")
        exists = name == "attribute_exists"
        return lambda i, v, n: (attribute_name(path, n) in i) is exists

    def operand(self) -> Operand:
        token = self.take()
        if token.startswith(":"):
            return lambda i, v, n: _value(v, token)
        if token in ("(", ")", ","):
            raise Unsupported(f"operand expected at {token!r}")
        return lambda i, v, n: i.get(attribute_name(token, n))


def _value(values: Values, token: str) -> Any:
    if token not in values:
        raise Unsupported(f"{token} is not in ExpressionAttributeValues")
    return values[token]


def _compare(operator: str, left: Operand, right: Operand) -> Condition:
    check = _COMPARATORS[operator]

    def condition(item: Item, values: Values, names: Names) -> bool:
        a, b = comparable(left(item, values, names)), comparable(right(item, values, names))
        if a is None or b is None or a[0] != b[0]:
            return operator == "<>" and not (a is None and b is None)
        return bool(check(a[1], b[1]))

    return condition


def _between(subject: Operand, low: Operand, high: Operand) -> Condition:
    def condition(item: Item, values: Values, names: Names) -> bool:
        x, a, b = (comparable(o(item, values, names)) for o in (subject, low, high))
        if x is None or a is None or b is None or not x[0] == a[0] == b[0]:
            return False
        return bool(a[1] <= x[1] <= b[1])

    return condition


def _begins_with(path: str, prefix: Operand) -> Condition:
    def condition(item: Item, values: Values, names: Names) -> bool:
        value, start = item.get(attribute_name(path, names)), prefix(item, values, names)
        return bool(value and "S" in value and "S" in start and value["S"].startswith(start["S"]))

    return condition


@lru_cache(maxsize=512)
def condition(text: str) -> Condition:
    parser = _Parser(tokens(text))
    compiled = parser.disjunction()
    parser.done()
    return compiled


@dataclass(frozen=True)
class KeyCondition:
    """`pk = :v [AND sk <op> :w | sk BETWEEN :a AND :b | begins_with(sk, :p)]`."""

    partition: str  # token (a name or #name)
    partition_value: str  # :placeholder
    sort_filter: Condition | None  # applied to the sort key only


@lru_cache(maxsize=256)
def key_condition(text: str) -> KeyCondition:
    parts = re.split(r"\s+AND\s+(?![^(]*\))", text.strip(), maxsplit=1, flags=re.IGNORECASE)
    first = tokens(parts[0])
    if len(first) != 3 or first[1] != "=" or not first[2].startswith(":"):
        raise Unsupported(f"key condition {text!r}: the partition key needs `name = :value` first")
    return KeyCondition(first[0], first[2], condition(parts[1]) if len(parts) > 1 else None)


@dataclass(frozen=True)
class Update:
    sets: tuple[tuple[str, Operand], ...]
    removes: tuple[str, ...]
    adds: tuple[tuple[str, str], ...]

    def apply(self, item: Item, values: Values, names: Names) -> Item:
        """The item after the update (a new dict; `item` is left as it was)."""
        after = dict(item)
        computed = [
            (attribute_name(path, names), operand(item, values, names)) for path, operand in self.sets
        ]
        for name, value in computed:
            after[name] = value
        for path in self.removes:
            after.pop(attribute_name(path, names), None)
        for path, placeholder in self.adds:
            name, delta = attribute_name(path, names), _value(values, placeholder)
            if "N" not in delta:
                raise Unsupported("ADD is implemented for numbers only")
            old = after.get(name)
            base = number(old["N"]) if old is not None and "N" in old else 0
            after[name] = {"N": str(base + number(delta["N"]))}
        return after


@lru_cache(maxsize=512)
def update(text: str) -> Update:
    items = tokens(text)
    sets: list[tuple[str, Operand]] = []
    removes: list[str] = []
    adds: list[tuple[str, str]] = []
    parser = _Parser(items)
    clause = ""
    while parser.peek() is not None:
        token = parser.peek() or ""
        if token.upper() in ("SET", "REMOVE", "ADD", "DELETE"):
            clause = parser.take().upper()
            if clause == "DELETE":
                raise Unsupported("DELETE (of set elements) is not implemented")
        elif token == ",":
            parser.take()
        elif clause == "SET":
            path = parser.take()
            parser.take("=")
            sets.append((path, _set_value(parser)))
        elif clause == "REMOVE":
            removes.append(parser.take())
        elif clause == "ADD":
            adds.append((parser.take(), parser.take()))
        else:
            raise Unsupported(f"update expression {text!r}")
    return Update(tuple(sets), tuple(removes), tuple(adds))


def _set_value(parser: _Parser) -> Operand:
    if parser.peek() == "if_not_exists":
        parser.take()
        parser.take("(")
        path = parser.take()
        parser.take(",")
        default = parser.operand()
        parser.take(")")
        first: Operand = lambda i, v, n: i.get(attribute_name(path, n)) or default(i, v, n)  # noqa: E731
    else:
        first = parser.operand()
    if parser.peek() in ("+", "-"):
        sign = 1 if parser.take() == "+" else -1
        second = parser.operand()
        return lambda i, v, n: {"N": str(number(first(i, v, n)["N"]) + sign * number(second(i, v, n)["N"]))}
    return first


@lru_cache(maxsize=256)
def projection(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(","))


def project(item: Item, text: str | None, names: Names) -> Item:
    if not text:
        return dict(item)
    wanted = (attribute_name(part, names) for part in projection(text))
    return {name: item[name] for name in wanted if name in item}
