"""Drive `leaseworker local up`'s live view in a pseudo-terminal, as a person at a keyboard would.

It must draw the workers and the connections, react to a key (k: SIGKILL the busiest worker, and
the takeover appears with its measured time), and on Ctrl-C stop everything it started and exit 0.

The Ctrl-C must work however the test was started. A non-interactive shell starts background jobs
with SIGINT ignored, and every descendant inherits that (`make test > log &` did: the view never
saw the Ctrl-C). So the test also runs the command with SIGINT ignored, as such a job would.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pexpect
import pytest

from tests.system.procscan import MARKER_VAR, processes_with_marker

LEASEWORKER = Path(sys.executable).with_name("leaseworker")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ANSI_UNFINISHED = re.compile(r"\x1b(\[[0-9;?]*)?\Z")  # a sequence cut by the end of a read

# Ctrl-C → the stop is seen: one loop step (the view's table scan has a 2 s deadline, a redraw,
# half a second of waiting for keys). Ctrl-C → exit: workers stop gracefully in about a second;
# a worker that had to be SIGKILLed after its 10 s grace would exceed this.
STOP_SEEN_S = 5.0
EXITED_S = 10.0


class Screen:
    """The terminal output with styling stripped; `expect` searches what came after the last match."""

    def __init__(self, child: pexpect.spawn) -> None:
        self.child = child
        self.text = ""
        self.pos = 0
        self._unfinished = ""

    def expect(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        compiled = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            match = compiled.search(self.text, self.pos)
            if match:
                self.pos = match.end()
                return match
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no {pattern!r} within {timeout} s; screen ends with {self.text[-1500:]!r}"
                )
            try:
                chunk = self.child.read_nonblocking(65536, timeout=0.5)
            except pexpect.TIMEOUT:
                continue
            except pexpect.EOF:
                self.text += self._unfinished
                self._unfinished = ""
                if compiled.search(self.text, self.pos):
                    continue
                raise AssertionError(
                    f"exited before {pattern!r}; output ends with {self.text[-1500:]!r}"
                ) from None
            self._append(chunk)

    def _append(self, chunk: str) -> None:
        """Strip styling; a sequence split between two reads is kept until it is complete."""
        data = self._unfinished + chunk
        cut = ANSI_UNFINISHED.search(data)
        self._unfinished = cut.group() if cut else ""
        self.text += ANSI.sub("", data[: cut.start()] if cut else data)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what a shell does to a background job


@pytest.mark.parametrize("sigint", ["inherited", "ignored"])
def test_live_view_keys_and_ctrl_c(tmp_path: Path, marker: str, sigint: str) -> None:
    env = {**os.environ, MARKER_VAR: marker, "TERM": "xterm-256color"}
    child = pexpect.spawn(
        str(LEASEWORKER),
        ["local", "up", "--no-auto-faults", "--workers", "3", "--connections", "6", "--root", str(tmp_path)],
        env=env,
        dimensions=(40, 160),
        encoding="utf-8",
        timeout=60,
        preexec_fn=_ignore_sigint if sigint == "ignored" else None,
    )
    screen = Screen(child)
    try:
        screen.expect("worker +pid +status +owned +load +msg/s +hb age +session")
        screen.expect("connection +state +owner +epoch +checkpoint +lag")
        screen.expect(r"feed-0\d +STARTED +w\d +1 ")  # a connection row with an owner at epoch 1
        screen.expect(r"w\d +\d+ +alive +\d+ +\d+ +\d+ +\d+\.\d s +live ")  # a session's load and age
        # The mixed fleet: the protocol column, and the two real feeds' replays beside the 6.
        screen.expect("connection +state +owner +epoch +checkpoint +lag +protocol +gaps +lease")
        screen.expect(r"coinbase-1 +STARTED +w\d +\d+ .*generic/1 \[coinbase-exchange\]")
        screen.expect(r"feed-0\d +STARTED +w\d +\d+ .*seqfeed/1 +- ")
        screen.expect(r"jetstream-1 +STARTED +w\d +\d+ .*generic/1 \[jetstream\] +0 ")
        screen.expect("all 8 connections owned")  # 6 seqfeed/1 + jetstream-1 + coinbase-1
        # Session mode (the default) checkpoints into the owner's checkpoint item: the column shows
        # that effective checkpoint moving, not the item's last_seq (-1 until a release or claim).
        screen.expect(r"feed-0\d +STARTED +w\d +1 +[1-9]\d* +\d+ +seqfeed/1 ", timeout=15)
        running = processes_with_marker(marker)
        assert len(running) >= 8, running  # DynamoDB Local, moto, the feed, 2 replays, three workers

        child.send("k")
        victim = screen.expect(r"SIGKILL child (w\d) \(held").group(1)
        screen.expect(rf"{victim}: \d+ connections taken over, max \d+\.\d\d s \(within", timeout=30)
        screen.expect(rf"{victim} +\d+ +killed .*fenced")  # the worker table shows it, its session fenced

        child.sendintr()  # Ctrl-C, through the terminal's line discipline
        interrupted = time.monotonic()
        screen.expect(r"SIGINT: stopping \d+ processes by pid", timeout=STOP_SEEN_S)
        seen_s = time.monotonic() - interrupted
        screen.expect("stopped: every process this command started has exited", timeout=EXITED_S)
        child.expect(pexpect.EOF, timeout=EXITED_S)
        child.wait()
        exited_s = time.monotonic() - interrupted
        left = processes_with_marker(marker)  # the moment it exited, not after a grace period
    finally:
        child.close(force=True)
    print(f"Ctrl-C → stop seen {seen_s:.2f} s, → exit {exited_s:.2f} s (SIGINT {sigint})")
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)
    assert exited_s <= EXITED_S, exited_s
    assert left == [], left
    # The generic/1 connections were delivered: their records are in the sink.
    records = _sink(tmp_path)
    assert any(r["kind"] == "data" for r in records["jetstream-1"]), "no jetstream-1 data in the sink"
    assert any(r["kind"] == "data" for r in records["coinbase-1"]), "no coinbase-1 data in the sink"
    assert records["coinbase-1"][0]["kind"] == "gap"  # a feed that cannot replay: marked from the start
    assert not [r for r in records["jetstream-1"] if r["kind"] == "gap"]


def _sink(root: Path) -> dict[str, list[dict[str, object]]]:
    """Every sink record by connection, each file in its order, files by name."""
    records: dict[str, list[dict[str, object]]] = {}
    for path in sorted((root / "sink").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            records.setdefault(str(record["connection_id"]), []).append(record)
    for items in records.values():
        items.sort(key=lambda r: (int(str(r["epoch"])), int(str(r["seq"]))))
    return records


def test_live_view_scripted_faults_mark_the_feed_that_cannot_replay(tmp_path: Path, marker: str) -> None:
    """The demo's script (auto faults) in a mixed fleet: its SIGKILL hits coinbase-1's owner, and
    the takeover shows as a gap event with the trade ids around the hole; jetstream-1 moves too
    (in the kill or the SIGTERM) and resumes from its cursor with no gap marker."""
    env = {**os.environ, MARKER_VAR: marker, "TERM": "xterm-256color"}
    child = pexpect.spawn(
        str(LEASEWORKER),
        ["local", "up", "--workers", "3", "--connections", "4", "--root", str(tmp_path)],
        env=env,
        dimensions=(70, 160),
        encoding="utf-8",
        timeout=60,
    )
    screen = Screen(child)
    try:
        screen.expect(r"gap +coinbase-1 connect \(nothing delivered before; next trade \d+\)")
        screen.expect(r"auto 1/2: SIGKILL w\d's worker child", timeout=60)
        screen.expect(r"SIGKILL child w\d \(held \d+: coinbase-1")
        screen.expect(r"auto faults done", timeout=90)
        child.send("q")
        screen.expect("stopped: every process this command started has exited", timeout=EXITED_S + 5)
        child.expect(pexpect.EOF, timeout=EXITED_S)
        child.wait()
        left = processes_with_marker(marker)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)
    assert left == [], left
    text = screen.text
    assert re.search(
        r"gap +coinbase-1 takeover ≈?\d+\.\d s \(trade BTC-USD \d+, ETH-USD \d+ → \d+\)", text
    ), text[-3000:]
    assert re.search(r"coinbase-1 taken over w\d → w\d in \d+\.\d\d s", text), text[-3000:]
    assert re.search(
        r"resumed +jetstream-1 resumed by w\d at epoch \d+ from time_us \d+, no gap marker", text
    )
    assert not re.search(r"gap +jetstream-1", text)
    records = _sink(tmp_path)
    takeovers = [r for r in records["coinbase-1"] if r["kind"] == "gap" and r["data"]["reason"] == "takeover"]  # type: ignore[index]
    assert takeovers, records["coinbase-1"][:3]
    assert not [r for r in records["jetstream-1"] if r["kind"] == "gap"]
    assert max(int(str(r["epoch"])) for r in records["jetstream-1"]) >= 2  # it did move
