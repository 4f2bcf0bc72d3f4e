"""P8's code cannot rot (bench/generic_vs_seqfeed.py): both protocols turn the bench upstream's
frames into the same records, and a tiny run produces its figures and its report section.
Nothing here judges the figures."""

from __future__ import annotations

import json

import pytest

from bench import generic_vs_seqfeed as p8
from leaseworker.protocol.adapter import Emit, Resume, SocketContext
from leaseworker.protocol.generic import GenericProtocol
from leaseworker.protocol.seqfeed import SeqfeedProtocol


def test_both_protocols_emit_the_same_payloads_and_generic_ignores_heartbeats() -> None:
    context = SocketContext("p8-x", 1, "w", Resume(seq=-1), {})
    seqfeed = SeqfeedProtocol("ws://127.0.0.1:1/seqfeed/p8-x").adapter(context, 0.0)
    generic = GenericProtocol(p8.generic_config("ws://127.0.0.1:1", 0)).adapter(context, 0.0)
    assert any(type(a).__name__ == "Ready" for a in generic.on_open(0.0, 0))
    seq_actions = [a for n in range(3) for a in seqfeed.on_frame(p8.seqfeed_frame("p8-x", n), 0.0, 0)]
    gen_actions = [a for n in range(3) for a in generic.on_frame(p8.generic_frame("p8-x", n), 0.0, 0)]
    assert generic.on_frame(p8.HEARTBEAT_FRAME, 0.0, 0) == []
    seq_records = [a for a in seq_actions if isinstance(a, Emit)]
    gen_records = [a for a in gen_actions if isinstance(a, Emit)]
    assert len(seq_records) == len(gen_records) == 3
    assert [a.data for a in seq_records] == [a.data for a in gen_records]
    assert [a.data for a in gen_records] == [json.loads(p8.payload("p8-x", n)) for n in range(3)]
    assert [a.cursor for a in gen_records] == [p8.T0_US + n for n in range(3)]
    url = generic.connect_request().url
    assert url.endswith("/generic/p8-x?rate=0") and "cursor" not in url


@pytest.mark.system
def test_a_tiny_p8_run_produces_figures_and_its_report_section() -> None:
    results = p8.run("tiny")
    summary = results["summary"]
    for protocol in p8.PROTOCOLS:
        assert summary["msgs_per_cpu_s"][protocol] > 0
        assert summary["kb_per_connection"][protocol] > 0
        assert all(run["failures"] == 0 for run in results["throughput"][protocol])
        assert all(step["all_delivering"] for step in results["memory"][protocol]["steps"])
    assert summary["ratio"] > 0 and summary["memory_ratio"] > 0
    text = "\n".join(p8.section(json.loads(json.dumps(results))))
    assert "## P8" in text and "generic/1 / seqfeed/1" in text
