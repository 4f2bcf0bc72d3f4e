"""`generic/1` templates (docs/design.md §4.2): the URL, the headers and the frames a socket sends.

Tags: `{{cursor}}`, `{{connection_id}}`, `{{epoch}}`, `{{worker_id}}`, `{{msg_id}}`,
`{{env:NAME}}`, `{{secret:NAME#KEY}}`, and the section `{{#cursor}}…{{/cursor}}`, rendered only
when there is a checkpoint cursor. Templates are parsed once, when the config is validated
(`TemplateError` for a bad one), and rendered per socket, which never raises.

- In a URL, a value substituted after the `?` is percent-encoded; elsewhere it goes in as is.
- In a send that is a JSON value, templates render inside its string values; a string that is
  exactly `{{cursor}}`, `{{epoch}}` or `{{msg_id}}` becomes that JSON value (a number stays a
  number, no cursor is null). A send that is a string is a text frame, rendered as text.
- A cursor renders as itself when it is a string, as compact JSON otherwise (a keyed feed's
  `{key: cursor}` map included).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote, urlsplit, urlunsplit

PLAIN_NAMES: Final = frozenset({"cursor", "connection_id", "epoch", "worker_id", "msg_id"})
# A string that is exactly one of these tags renders as a JSON value in a JSON send.
VALUE_NAMES: Final = frozenset({"cursor", "epoch", "msg_id"})
MAX_JSON_DEPTH: Final = 32  # for a send's JSON value; configs are small

_TAG: Final = re.compile(r"\{\{\s*([#/]?)\s*([^{}]*?)\s*\}\}")
_ENV: Final = re.compile(r"env:[A-Za-z_][A-Za-z0-9_]*")
# A Secrets Manager name (letters, digits and /_+=.@-) or ARN (with `:`), as secrets.py resolves
# it; the key is a JSON key of the secret string.
_SECRET: Final = re.compile(r"secret:[A-Za-z0-9/_+=.@:-]+#[^#{}\s]+")


class TemplateError(ValueError):
    """A template that does not parse: an unknown tag, an unbalanced section."""


@dataclass(frozen=True, slots=True)
class Var:
    name: str


@dataclass(frozen=True, slots=True)
class Section:
    """`{{#cursor}}…{{/cursor}}`: the body renders only when a cursor exists."""

    body: tuple[str | Var, ...]


Part = str | Var | Section


@dataclass(frozen=True, slots=True)
class Values:
    """What a template renders from, for one socket. `cursor` None: no checkpoint cursor."""

    connection_id: str
    epoch: int
    worker_id: str
    cursor: Any = None
    msg_id: int = 0
    references: Mapping[str, str] = field(default_factory=dict)


def _check_name(name: str) -> str:
    if name in PLAIN_NAMES or _ENV.fullmatch(name) or _SECRET.fullmatch(name):
        return name
    raise TemplateError(
        f"unknown template tag {{{{{name[:40]}}}}} (known: cursor, connection_id, epoch, worker_id, "
        "msg_id, env:NAME, secret:NAME#KEY)"
    )


@dataclass(frozen=True, slots=True)
class Template:
    source: str
    parts: tuple[Part, ...]

    @classmethod
    def parse(cls, text: str) -> Template:
        parts: list[Part] = []
        section: list[str | Var] | None = None
        position = 0
        for tag in _TAG.finditer(text):
            literal = text[position : tag.start()]
            position = tag.end()
            _check_literal(literal)
            target: list[Any] = parts if section is None else section
            if literal:
                target.append(literal)
            sigil, name = tag.group(1), tag.group(2)
            if sigil == "#":
                if name != "cursor":
                    raise TemplateError(f"only {{{{#cursor}}}} sections exist, not {{{{#{name[:40]}}}}}")
                if section is not None:
                    raise TemplateError("{{#cursor}} sections do not nest")
                section = []
            elif sigil == "/":
                if name != "cursor" or section is None:
                    raise TemplateError(f"{{{{/{name[:40]}}}}} closes no open section")
                parts.append(Section(tuple(section)))
                section = None
            else:
                target.append(Var(_check_name(name)))
        if section is not None:
            raise TemplateError("{{#cursor}} is never closed by {{/cursor}}")
        rest = text[position:]
        _check_literal(rest)
        if rest:
            parts.append(rest)
        return cls(text, tuple(parts))

    def names(self) -> frozenset[str]:
        found: set[str] = set()
        for part in self.parts:
            if isinstance(part, Var):
                found.add(part.name)
            elif isinstance(part, Section):
                found.add("cursor")
                found.update(item.name for item in part.body if isinstance(item, Var))
        return frozenset(found)

    def exact(self) -> str | None:
        """The tag's name when the whole template is one tag."""
        if len(self.parts) == 1 and isinstance(self.parts[0], Var):
            return self.parts[0].name
        return None

    def render(self, values: Values, *, url: bool = False, header: bool = False) -> str:
        out: list[str] = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, Var):
                out.append(_substitute(part.name, values, out, url=url, header=header))
            elif values.cursor is not None:
                for item in part.body:
                    if isinstance(item, str):
                        out.append(item)
                    else:
                        out.append(_substitute(item.name, values, out, url=url, header=header))
        return "".join(out)


def _check_literal(literal: str) -> None:
    if "{{" in literal:
        raise TemplateError(f"'{{{{' opens no valid tag near {literal[literal.index('{{') :][:40]!r}")


def _text(name: str, values: Values) -> str:
    if name == "cursor":
        cursor = values.cursor
        if cursor is None:
            return ""
        return cursor if isinstance(cursor, str) else _compact(cursor)
    if name == "connection_id":
        return values.connection_id
    if name == "worker_id":
        return values.worker_id
    if name == "epoch":
        return str(values.epoch)
    if name == "msg_id":
        return str(values.msg_id)
    return values.references.get(name, "")


def _substitute(name: str, values: Values, rendered: list[str], *, url: bool, header: bool) -> str:
    text = _text(name, values)
    if url and any("?" in piece for piece in rendered):
        return quote(text, safe="")
    if header:  # a value must not be able to start a header of its own
        return text.replace("\r", "").replace("\n", "")
    return text


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class SendTemplate:
    """A frame to send: a text template (the send was a string) or a JSON value whose strings
    are templates (held as Template where they have a tag)."""

    text: Template | None
    value: Any = None

    @classmethod
    def parse(cls, send: Any) -> SendTemplate:
        if isinstance(send, str):
            return cls(Template.parse(send))
        return cls(None, _parse_json(send, 1))

    def names(self) -> frozenset[str]:
        if self.text is not None:
            return self.text.names()
        found: set[str] = set()
        stack: list[Any] = [self.value]
        while stack:
            item = stack.pop()
            if isinstance(item, Template):
                found.update(item.names())
            elif isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
        return frozenset(found)

    def render(self, values: Values) -> str:
        if self.text is not None:
            return self.text.render(values)
        return _compact(_render_json(self.value, values))


def _parse_json(value: Any, depth: int) -> Any:
    if depth > MAX_JSON_DEPTH:
        raise TemplateError(f"a send nests deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, str):
        template = Template.parse(value)
        return template if any(not isinstance(part, str) for part in template.parts) else value
    if isinstance(value, dict):
        return {key: _parse_json(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list):
        return [_parse_json(item, depth + 1) for item in value]
    return value


def _render_json(value: Any, values: Values) -> Any:
    if isinstance(value, Template):
        name = value.exact()
        if name == "cursor":
            return values.cursor
        if name == "epoch":
            return values.epoch
        if name == "msg_id":
            return values.msg_id
        return value.render(values)
    if isinstance(value, dict):
        return {key: _render_json(item, values) for key, item in value.items()}
    if isinstance(value, list):
        return [_render_json(item, values) for item in value]
    return value


def references_in(names: frozenset[str]) -> frozenset[str]:
    """The `env:` and `secret:` references among tag names."""
    return frozenset(name for name in names if name.startswith(("env:", "secret:")))


def redact_url(url: str) -> str:
    """The URL for logs: every query value (and the fragment, and a userinfo password) is "***".

    Never raises: a URL that does not even split shows as its scheme only."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            if ":" in userinfo:
                netloc = f"{userinfo.split(':', 1)[0]}:***@{host}"
        query = "&".join(
            f"{item.split('=', 1)[0]}=***" if "=" in item else "***"
            for item in parts.query.split("&")
            if item
        )
        return urlunsplit((parts.scheme, netloc, parts.path, query, "***" if parts.fragment else ""))
    except ValueError:
        scheme = url.split(":", 1)[0] if ":" in url else ""
        return f"{scheme[:10]}://<unparseable>"
