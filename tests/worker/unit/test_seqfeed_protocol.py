"""`seqfeed/1` decoder, table-driven: the protocol rules with no sockets (docs/design.md §4)."""

from __future__ import annotations

import contextlib
import json
import random
from typing import Any

import pytest

from leaseworker.protocol import (
    MAX_FRAME_BYTES,
    MAX_NESTING_DEPTH,
    STALE_EPOCH,
    DataFrame,
    ErrorFrame,
    FrameDecoder,
    ProtocolError,
    ReplayedFrame,
    SeqfeedProtocol,
    UpstreamProtocol,
)


def data(seq: Any, payload: Any = None) -> str:
    return json.dumps({"type": "data", "seq": seq, "data": payload})


def decoder(after_seq: int = -1) -> FrameDecoder:
    return SeqfeedProtocol().decoder(after_seq)


def test_protocol_satisfies_the_interface() -> None:
    protocol: UpstreamProtocol = SeqfeedProtocol()
    assert protocol.name == "seqfeed/1"
    assert STALE_EPOCH == "stale_epoch"
    assert MAX_FRAME_BYTES == 1024 * 1024


@pytest.mark.parametrize(
    ("connection_id", "after_seq", "epoch", "worker_id", "expected"),
    [
        (
            "c-1",
            41,
            7,
            "w1",
            '{"type":"subscribe","connection_id":"c-1","after_seq":41,"epoch":7,"worker_id":"w1"}',
        ),
        (
            "feed:a.b_c",
            -1,
            1,
            "host-12-ab12cd",
            '{"type":"subscribe","connection_id":"feed:a.b_c","after_seq":-1,"epoch":1,'
            '"worker_id":"host-12-ab12cd"}',
        ),
    ],
)
def test_subscribe_frame_is_exact(
    connection_id: str, after_seq: int, epoch: int, worker_id: str, expected: str
) -> None:
    frames = SeqfeedProtocol().opening_frames(
        connection_id=connection_id, after_seq=after_seq, epoch=epoch, worker_id=worker_id
    )
    assert frames == [expected]


@pytest.mark.parametrize("after_seq", [-1, 0, 99])
def test_contiguous_run_advances_last_seq(after_seq: int) -> None:
    dec = decoder(after_seq)
    assert dec.last_seq == after_seq
    for seq in range(after_seq + 1, after_seq + 6):
        assert dec.decode(data(seq, {"n": seq})) == DataFrame(seq=seq, data={"n": seq})
        assert dec.last_seq == seq


@pytest.mark.parametrize(
    ("frame", "kind"),
    [
        # sequence errors, after a decoder that has accepted 0..2
        (data(4), "gap"),
        (data(100), "gap"),
        (data(10**30), "gap"),
        # not JSON / not an object
        ("not json", "bad_json"),
        ('{"type":"data","seq":3,', "bad_json"),
        ("", "bad_json"),
        # not strict JSON: no sink could write these back as JSON
        ('{"type":"data","seq":3,"data":NaN}', "bad_json"),
        ('{"type":"data","seq":3,"data":[Infinity]}', "bad_json"),
        ('{"type":"data","seq":3,"data":{"x":-Infinity}}', "bad_json"),
        ('{"type":"data","seq":NaN,"data":1}', "bad_json"),
        ('{"type":"data","seq":3,"data":1e400}', "bad_json"),  # overflows to inf
        ('{"type":"data","seq":3,"data":-1e400}', "bad_json"),
        ('{"type":"data","seq":3,"data":' + "9" * 5000 + "}", "bad_json"),  # past int digit limit
        # nesting: too deep for the parser itself, and deeper than the limit
        ('{"type":"data","seq":3,"data":' + "[" * 100_000 + "]" * 100_000 + "}", "too_deep"),
        ('{"type":"data","seq":3,"data":' + '{"a":' * 100_000 + "1" + "}" * 100_000 + "}", "too_deep"),
        (data(3, json.loads("[" * MAX_NESTING_DEPTH + "]" * MAX_NESTING_DEPTH)), "too_deep"),
        # binary frames: seqfeed/1 frames are text, even when the bytes are valid JSON
        (b"\xff\xfe\x00garbage", "binary"),
        (data(3).encode(), "binary"),
        ("[1, 2, 3]", "bad_frame"),
        ('"data"', "bad_frame"),
        ("3", "bad_frame"),
        ("null", "bad_frame"),
        # mistyped or missing fields
        (data("3"), "bad_frame"),
        (data(True), "bad_frame"),
        (data(3.0), "bad_frame"),
        (data(None), "bad_frame"),
        (data(-1), "bad_frame"),
        (data(-5), "bad_frame"),
        (json.dumps({"type": "data", "data": 1}), "bad_frame"),
        (json.dumps({"type": "data", "seq": 3}), "bad_frame"),
        (json.dumps({"seq": 3, "data": 1}), "bad_frame"),
        (json.dumps({"type": "error", "message": "no code"}), "bad_frame"),
        (json.dumps({"type": "error", "code": 5, "message": "x"}), "bad_frame"),
        (json.dumps({"type": "error", "code": "x", "message": 5}), "bad_frame"),
        # unknown type
        (json.dumps({"type": "subscribe", "seq": 3}), "unexpected"),
        (json.dumps({"type": "heartbeat"}), "unexpected"),
        (json.dumps({"type": 3}), "unexpected"),
        # oversized, as text and as bytes
        (data(3, "x" * MAX_FRAME_BYTES), "oversized"),
        (data(3, "é" * (MAX_FRAME_BYTES // 2)), "oversized"),  # < 1 Mi code points, > 1 MiB UTF-8
    ],
)
def test_bad_frames_raise_and_do_not_advance(frame: str | bytes, kind: str) -> None:
    dec = decoder()
    for seq in range(3):
        dec.decode(data(seq))
    with pytest.raises(ProtocolError) as caught:
        dec.decode(frame)
    assert caught.value.kind == kind
    assert "\n" not in str(caught.value)
    assert dec.last_seq == 2
    # The decoder is still usable: the next contiguous frame is accepted.
    assert dec.decode(data(3)) == DataFrame(seq=3, data=None)


def test_error_message_is_one_line() -> None:
    dec = decoder()
    with pytest.raises(ProtocolError) as caught:
        dec.decode("line one\nline two")
    assert caught.value.kind == "bad_json"
    assert "\n" not in caught.value.message
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        (
            {"type": "error", "code": "stale_epoch", "message": "epoch 3 < 4"},
            ErrorFrame(code=STALE_EPOCH, message="epoch 3 < 4"),
        ),
        ({"type": "error", "code": "unavailable", "message": ""}, ErrorFrame("unavailable", "")),
        ({"type": "error", "code": "bad_request"}, ErrorFrame("bad_request", "")),
    ],
)
def test_error_frames(frame: dict[str, Any], expected: ErrorFrame) -> None:
    dec = decoder(5)
    assert dec.decode(json.dumps(frame)) == expected
    assert dec.last_seq == 5


def test_binary_frames_are_refused_even_when_they_hold_valid_json() -> None:
    dec = decoder()
    with pytest.raises(ProtocolError) as caught:
        dec.decode(data(0, "α").encode("utf-8"))
    assert caught.value.kind == "binary"
    assert dec.last_seq == -1


@pytest.mark.parametrize("seq", [0, 1, 2])
def test_an_overlapping_replay_is_dropped_not_an_error(seq: int) -> None:
    dec = decoder()
    for n in range(3):
        dec.decode(data(n))
    assert dec.decode(data(seq, "again")) == ReplayedFrame(seq)
    assert dec.last_seq == 2
    assert dec.decode(data(3)) == DataFrame(3, None)


def test_a_resumed_decoder_drops_what_came_before_after_seq() -> None:
    dec = decoder(after_seq=10)
    assert [dec.decode(data(seq)) for seq in (8, 9, 10, 11)] == [
        ReplayedFrame(8),
        ReplayedFrame(9),
        ReplayedFrame(10),
        DataFrame(11, None),
    ]


def test_nesting_up_to_the_limit_is_accepted() -> None:
    # The frame object is level 1, so its data may hold MAX_NESTING_DEPTH - 1 levels.
    levels = MAX_NESTING_DEPTH - 1
    nested = json.loads("[" * levels + "]" * levels)
    assert decoder().decode(data(0, nested)) == DataFrame(0, nested)


def test_a_lone_surrogate_escape_is_data_not_an_error() -> None:
    frame = '{"type":"data","seq":0,"data":{"s":"\\ud800","\\udfff":1}}'
    assert decoder().decode(frame) == DataFrame(0, {"s": "\ud800", "\udfff": 1})


@pytest.mark.parametrize("seed", range(20))
def test_decode_raises_nothing_but_protocol_error(seed: int) -> None:
    """Whatever text arrives, the decoder answers with a frame or a ProtocolError."""
    rng = random.Random(seed)
    alphabet = '{}[]":,0123456789-.eE+ tfnaulrsNIy\\ud800'
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 60)))
        with contextlib.suppress(ProtocolError):
            decoder().decode(text)


def test_frame_just_under_the_limit_is_accepted() -> None:
    dec = decoder()
    overhead = len(data(0, ""))
    frame = data(0, "x" * (MAX_FRAME_BYTES - overhead))
    assert len(frame.encode()) == MAX_FRAME_BYTES
    assert dec.decode(frame) == DataFrame(0, "x" * (MAX_FRAME_BYTES - overhead))
    assert dec.last_seq == 0


@pytest.mark.parametrize("after_seq", [-2, True])
def test_decoder_rejects_a_bad_start(after_seq: int) -> None:
    with pytest.raises(ValueError):
        decoder(after_seq)
