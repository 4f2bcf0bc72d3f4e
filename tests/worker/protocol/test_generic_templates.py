"""generic/1 building blocks: RFC 6901 pointers, JSON equality, templates, URL redaction."""

from __future__ import annotations

from typing import Any

import pytest

from leaseworker.protocol.generic import redact_url
from leaseworker.protocol.generic.pointers import MISSING, Pointer, PointerError, json_equal, matches, resolve
from leaseworker.protocol.generic.templates import SendTemplate, Template, TemplateError, Values

# RFC 6901 §5's document and its examples.
RFC: dict[str, Any] = {
    "foo": ["bar", "baz"],
    "": 0,
    "a/b": 1,
    "c%d": 2,
    "e^f": 3,
    "g|h": 4,
    "i\\j": 5,
    'k"l': 6,
    " ": 7,
    "m~n": 8,
}


@pytest.mark.parametrize(
    ("pointer", "expected"),
    [
        ("", RFC),
        ("/foo", ["bar", "baz"]),
        ("/foo/0", "bar"),
        ("/", 0),
        ("/a~1b", 1),
        ("/c%d", 2),
        ("/e^f", 3),
        ("/g|h", 4),
        ("/i\\j", 5),
        ('/k"l', 6),
        ("/ ", 7),
        ("/m~0n", 8),
        ("/foo/2", MISSING),
        ("/foo/-", MISSING),
        ("/foo/01", MISSING),
        ("/foo/x", MISSING),
        ("/nope", MISSING),
        ("/foo/0/deeper", MISSING),
        ("/m~01", MISSING),  # "~01" is "~1", not "/"
    ],
)
def test_rfc6901(pointer: str, expected: Any) -> None:
    assert resolve(RFC, pointer) == expected if expected is not MISSING else resolve(RFC, pointer) is MISSING


def test_pointer_escapes_in_order() -> None:
    assert Pointer.parse("/~01").tokens == ("~1",)
    assert resolve({"~1": "tilde-one"}, "/~01") == "tilde-one"


@pytest.mark.parametrize("text", ["foo", "/a~", "/a~2b", "#/a"])
def test_bad_pointers(text: str) -> None:
    with pytest.raises(PointerError):
        Pointer.parse(text)


@pytest.mark.parametrize(
    ("left", "right", "equal"),
    [
        (1, 1.0, True),
        (True, 1, False),
        (False, 0, False),
        ("1", 1, False),
        (None, None, True),
        (None, "null", False),
        ({"a": [1, {"b": True}]}, {"a": [1.0, {"b": True}]}, True),
        ({"a": 1}, {"a": 1, "b": 2}, False),
        ([1, 2], [2, 1], False),
        (float("nan"), float("nan"), False),
    ],
)
def test_json_equal(left: Any, right: Any, equal: bool) -> None:
    assert json_equal(left, right) is equal


def test_matches_all_pairs() -> None:
    table = ((Pointer.parse("/0/T"), "success"), (Pointer.parse("/0/msg"), "connected"))
    assert matches([{"T": "success", "msg": "connected"}], table)
    assert not matches([{"T": "success", "msg": "authenticated"}], table)
    assert not matches({"T": "success"}, table)
    assert matches("anything", ())  # an empty table holds for any frame


VALUES = Values(
    "conn-1",
    7,
    "worker a/1",
    cursor=1725911162329308,
    msg_id=3,
    references={"env:REGION": "eu west", "secret:alp/keys#key": "K&Y=1"},
)


@pytest.mark.parametrize(
    ("template", "values", "url", "expected"),
    [
        (
            "wss://j/sub?c=post{{#cursor}}&cursor={{cursor}}{{/cursor}}",
            VALUES,
            True,
            "wss://j/sub?c=post&cursor=1725911162329308",
        ),
        (
            "wss://j/sub?c=post{{#cursor}}&cursor={{cursor}}{{/cursor}}",
            Values("c", 1, "w"),
            True,
            "wss://j/sub?c=post",
        ),
        (
            "wss://h/{{env:REGION}}/x?k={{secret:alp/keys#key}}&w={{worker_id}}",
            VALUES,
            True,
            "wss://h/eu west/x?k=K%26Y%3D1&w=worker%20a%2F1",
        ),
        ("{{connection_id}}:{{epoch}}:{{msg_id}}", VALUES, False, "conn-1:7:3"),
        ("{{ cursor }}", Values("c", 1, "w", cursor="abc"), False, "abc"),
        ("{{cursor}}", Values("c", 1, "w", cursor={"BTC-USD": 5}), False, '{"BTC-USD":5}'),
        ("plain", VALUES, False, "plain"),
    ],
)
def test_render(template: str, values: Values, url: bool, expected: str) -> None:
    assert Template.parse(template).render(values, url=url) == expected


def test_header_values_cannot_add_headers() -> None:
    values = Values("c", 1, "w", references={"env:T": "a\r\nX-Evil: 1"})
    assert Template.parse("Bearer {{env:T}}").render(values, header=True) == "Bearer aX-Evil: 1"


@pytest.mark.parametrize(
    "text",
    [
        "{{what}}",
        "{{#epoch}}x{{/epoch}}",
        "{{#cursor}}{{#cursor}}{{/cursor}}{{/cursor}}",
        "{{/cursor}}",
        "{{#cursor}}",
        "{{ never",
        "{{env:}}",
        "{{secret:name}}",
        "{{secret:a#b#c}}",
    ],
)
def test_bad_templates(text: str) -> None:
    with pytest.raises(TemplateError):
        Template.parse(text)


def test_json_send_renders_values_and_strings() -> None:
    send = SendTemplate.parse(
        {
            "id": "{{msg_id}}",
            "after": "{{cursor}}",
            "epoch": "{{epoch}}",
            "note": "w={{worker_id}} e={{epoch}}",
            "auth": {"key": "{{secret:alp/keys#key}}"},
            "list": ["{{connection_id}}", 1, None, True],
            "n": 2.5,
        }
    )
    assert send.render(VALUES) == (
        '{"id":3,"after":1725911162329308,"epoch":7,"note":"w=worker a/1 e=7",'
        '"auth":{"key":"K&Y=1"},"list":["conn-1",1,null,true],"n":2.5}'
    )
    assert '"after":null' in send.render(Values("c", 1, "w"))  # no cursor: null
    assert send.names() == {"msg_id", "cursor", "epoch", "worker_id", "secret:alp/keys#key", "connection_id"}


def test_text_send_is_text() -> None:
    assert SendTemplate.parse("ping {{msg_id}}").render(VALUES) == "ping 3"
    assert SendTemplate.parse({"a": "{{cursor}}"}).render(Values("c", 1, "w", cursor="x")) == '{"a":"x"}'


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("wss://h/p?token=abc&x=1", "wss://h/p?token=***&x=***"),
        ("wss://user:pw@h:9443/p?streams=a/b", "wss://user:***@h:9443/p?streams=***"),
        ("wss://user@h/p", "wss://user@h/p"),
        ("wss://h/p?flag&k=", "wss://h/p?***&k=***"),
        ("wss://h/p#frag", "wss://h/p#***"),
        ("wss://h/p", "wss://h/p"),
        ("wss://[::1/x?token=secret", "wss://<unparseable>"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown
