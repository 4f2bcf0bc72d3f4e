"""What `connections list` and `show` print for a person (issue 23): a piped or redirected `list`
is not folded at 80 columns, and `show` says which of checkpoint and last_seq a takeover resumes
after, and that its `updated_at_ms` does not follow session-mode checkpoints."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from leaseworker.cli.connection_views import render_show

LEASEWORKER = Path(sys.executable).with_name("leaseworker")
LONG_URL = "wss://feeds.example.com/a/rather/long/path/for/a/feed?symbols=BTC-USD,ETH-USD,SOL-USD"


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LEASEWORKER), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_a_piped_list_keeps_each_connection_on_one_line(dynamodb_endpoint: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k not in ("COLUMNS", "LINES")}
    env.update(AWS_REGION="us-east-1", AWS_ACCESS_KEY_ID="local", AWS_SECRET_ACCESS_KEY="local")
    target = ["--endpoint-url", dynamodb_endpoint, "--table", f"out-{time.monotonic_ns()}"]
    assert _run(*target, "table", "create", env=env).returncode == 0
    for cid in ("a-connection-with-a-long-id", "feed-b"):
        added = _run(*target, "connections", "add", cid, "--url", LONG_URL, env=env)
        assert added.returncode == 0, added.stderr
    listed = _run(*target, "connections", "list", env=env)  # stdout is a pipe, COLUMNS unset
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    header = [line for line in lines if "connection" in line and "checkpoint" in line]
    assert len(header) == 1, listed.stdout  # not `┃ connecti ┃` over `┃ on ┃`
    rows = [line for line in lines if "a-connection-with-a-long-id" in line]
    assert len(rows) == 1 and "symbols=***" in rows[0], listed.stdout  # one line, the URL whole
    assert max(len(line) for line in lines) > 80


def test_show_says_which_checkpoint_matters_and_prints_times_for_people() -> None:
    now = 1_796_454_349_477
    text = render_show(
        {
            "connection_id": "feed-08",
            "desired_state": "STARTED",
            "ws_url": "ws://127.0.0.1:9/feeds/feed-08",
            "lease_owner": "w3",
            "lease_epoch": 1,
            "lease_expires_at_ms": 2**53 - 1,  # held by its session
            "last_seq": 291,
            "checkpoint": 972,
            "updated_at_ms": now - 34_400,
        },
        now,
    )
    lines = {line.split()[0]: line for line in text.splitlines()}
    assert lines["lease"].endswith("held by its session")
    assert "9007199254740991" not in text
    assert lines["lease_expires_at_ms"].endswith("held by session")
    assert lines["checkpoint"].split()[1] == "972"
    assert "`checkpoint` is what a takeover resumes after" in lines["last_seq"]
    assert "UTC (34 s ago)" in lines["updated_at_ms"]
    assert "checkpoints do not touch it" in lines["updated_at_ms"]
    assert "from now" not in text
