"""Records serialise as strict JSON that always encodes as UTF-8 and decodes back losslessly."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from leaseworker.records import SinkRecord


def record(data: Any) -> SinkRecord:
    return SinkRecord(
        connection_id="c-1", seq=7, epoch=2, worker_id="w-1", received_at_ms=1_700_000_000_000, data=data
    )


def strict_loads(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} in a sink line")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize(
    "data",
    [
        {"s": "\ud800"},  # a lone high surrogate, as json.loads('"\\ud800"') gives it
        {"s": "\udfff", "\udc00key": ["\ud83d"]},  # lone low/high surrogates, in keys and lists
        "a\ud800b\udfffc",
        {"s": "é 中文 😀 \u2028 \x00 \x1f"},  # ordinary non-ASCII and control characters
        [1, -0.0, 1.5e300, 2**70, True, None, ""],
        {"nested": [[[{"a": [{"b": "\ud800"}]}]]]},
    ],
)
def test_to_json_is_strict_utf8_and_lossless(data: Any) -> None:
    line = record(data).to_json()
    line.encode("utf-8")  # never raises
    decoded = strict_loads(line)
    assert decoded["data"] == data
    assert decoded == {
        "connection_id": "c-1",
        "seq": 7,
        "epoch": 2,
        "cursor": None,
        "kind": "data",
        "worker_id": "w-1",
        "received_at_ms": 1_700_000_000_000,
        "data": data,
    }
    assert "\n" not in line


def test_a_keyed_record_carries_its_cursor_kind_and_key_and_an_unkeyed_one_no_key() -> None:
    keyed = SinkRecord("c-1", 0, 2, "w-1", 1, {"reason": "seq_gap"}, cursor=None, kind="gap", key="BTC-USD")
    assert strict_loads(keyed.to_json())["key"] == "BTC-USD"
    assert strict_loads(keyed.to_json())["kind"] == "gap"
    unkeyed = SinkRecord("c-1", 1, 2, "w-1", 1, {"t": 1}, cursor=1_700_000_000_000_001)
    assert "key" not in strict_loads(unkeyed.to_json())
    assert strict_loads(unkeyed.to_json())["cursor"] == 1_700_000_000_000_001


def test_non_ascii_stays_compact_utf8() -> None:
    assert '"é"' in record("é").to_json()


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_to_json_refuses_nan_and_infinity(value: float) -> None:
    with pytest.raises(ValueError):
        record({"x": [value]}).to_json()
