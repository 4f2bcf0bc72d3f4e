"""`connections add --config/--preset`, and what `list`/`show` print for feeds, through the real CLI.

Each command runs the installed `leaseworker` as a subprocess against DynamoDB Local (as
test_cli.py does). Bad input is one line on stderr naming the field and the rule, exit 2, and
leaves the table as it was. A resolved secret never reaches the table or the output: configs are
stored and shown with their references, and URLs are shown with query values redacted.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from leaseworker.cli.connection_views import human_time
from leaseworker.lease.vocabulary import SESSION_HELD
from leaseworker.protocol.generic import parse_config
from leaseworker.protocol.registry import MAX_CONFIG_BYTES
from tests.worker.integration.test_cli import (
    LEASEWORKER,
    bare_env,
    local_env,
    new_table,
    one_error_line,
    run,
    run_all,
    set_lease,
)

__all__ = ["bare_env", "local_env"]  # the fixtures test_cli.py defines, used here by name

WIDE = {"COLUMNS": "240"}
SECRET_VALUE = "s3cr3t-VALUE-never-shown"

HA_YAML = """\
# a generic/1 config in YAML: Home Assistant's auth handshake with a secret reference
protocol: generic/1
connect:
  url: "ws://127.0.0.1:8123/api/websocket?token={{secret:ha#token}}"
  headers:
    Authorization: "Bearer {{secret:ha#token}}"
open:
  - expect: {match: {/type: auth_required}}
  - send: {type: auth, access_token: "{{secret:ha#token}}"}
  - expect: {match: {/type: auth_ok}, fail: {/type: auth_invalid}}
frames:
  classify:
    - when: {/type: pong}
      action: heartbeat
"""


@pytest.fixture(scope="module")
def table(dynamodb_endpoint: str, local_env: dict[str, str]) -> list[str]:
    return new_table(dynamodb_endpoint, local_env)


def items_of(table: list[str], env: dict[str, str]) -> dict[str, dict[str, object]]:
    done = run(*table, "connections", "list", "--json", env=env)
    assert done.returncode == 0, done.stderr
    return {str(item["connection_id"]): item for item in json.loads(done.stdout)}


def added(done: subprocess.CompletedProcess[str], cid: str) -> None:
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stdout.startswith(f"added {cid}"), done.stdout


def test_preset_jetstream(table: list[str], local_env: dict[str, str]) -> None:
    done = run(
        *table,
        "connections",
        "add",
        "bsky",
        "--preset",
        "jetstream",
        "--param",
        "collections=app.bsky.feed.post,app.bsky.feed.like",
        "--param",
        "url=wss://jetstream.example.com/subscribe",
        env=local_env,
    )
    added(done, "bsky")
    assert "generic/1 [jetstream]" in done.stdout
    item = items_of(table, local_env)["bsky"]
    assert item["protocol"] == "generic/1" and item["preset"] == "jetstream"
    assert item["cursor"] is None
    text = item["protocol_config"]
    assert isinstance(text, str) and len(text.encode()) <= MAX_CONFIG_BYTES
    assert ": " not in text and "protocol" not in json.loads(text)  # compact, no protocol key
    config = parse_config(json.loads(text))
    assert item["ws_url"] == config.connect.url.source
    assert str(item["ws_url"]).startswith("wss://jetstream.example.com/subscribe?")
    assert "wantedCollections=app.bsky.feed.post&wantedCollections=app.bsky.feed.like" in str(item["ws_url"])


def test_config_yaml_file_and_show(
    table: list[str], local_env: dict[str, str], tmp_path: Path, dynamodb_endpoint: str
) -> None:
    path = tmp_path / "ha.yaml"
    path.write_text(HA_YAML)
    env = {**local_env, "HA_TOKEN": SECRET_VALUE, "SECRET": SECRET_VALUE, **WIDE}
    added(run(*table, "connections", "add", "ha", "--config", str(path), env=env), "ha")
    item = items_of(table, env)["ha"]
    assert item["protocol"] == "generic/1" and item["preset"] is None
    assert item["ws_url"] == "ws://127.0.0.1:8123/api/websocket?token={{secret:ha#token}}"
    stored = json.loads(str(item["protocol_config"]))
    assert "protocol" not in stored and stored["open"][1]["send"]["access_token"] == "{{secret:ha#token}}"

    # A checkpoint with a cursor, held by a session: show prints it all in words.
    set_lease(
        dynamodb_endpoint,
        table,
        "ha",
        lease_owner="w1",
        lease_epoch=3,
        last_seq=41,
        cursor='{"time_us":1733387412000000}',
        lease_expires_at_ms=SESSION_HELD,
    )
    shown = run(*table, "connections", "show", "ha", env=env)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert SECRET_VALUE not in out
    assert "generic/1" in out and "{{secret:ha#token}}" in out  # the config, as stored
    assert "ws://127.0.0.1:8123/api/websocket?token=***" in out  # the URL, redacted
    assert '{"time_us":1733387412000000}' in out and "41" in out
    lines = dict(line.split(None, 1) for line in out.splitlines() if line and not line.startswith(" "))
    assert lines["protocol"] == "generic/1"
    assert lines["lease_expires_at_ms"] == "held by session"
    assert " UTC (" in lines["updated_at_ms"] and "s ago)" in lines["updated_at_ms"]
    assert "in session mode its checkpoints do not touch it" in lines["updated_at_ms"]
    assert lines["cursor"] == '{"time_us":1733387412000000}'
    assert lines["last_seq"].split()[0] == "41" and lines["preset"] == "-"
    assert "access_token: '{{secret:ha#token}}'" in out  # the config as YAML

    listed = run(*table, "connections", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    assert SECRET_VALUE not in listed.stdout
    assert "protocol" in listed.stdout and "generic/1 [jetstream]" in listed.stdout
    assert "token=***" in listed.stdout and "{{secret:ha#token}}" not in listed.stdout
    raw = run(*table, "connections", "list", "--json", env=env).stdout
    assert SECRET_VALUE not in raw and "{{secret:ha#token}}" in raw  # --json: the stored values


def test_config_json_on_stdin(table: list[str], local_env: dict[str, str]) -> None:
    config = {"protocol": "generic/1", "connect": {"url": "wss://feed.example.com/ws?x=1"}}
    done = subprocess.run(
        [str(LEASEWORKER), *table, "connections", "add", "stdin-1", "--config", "-"],
        input=json.dumps(config),
        env=local_env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    added(done, "stdin-1")
    item = items_of(table, local_env)["stdin-1"]
    assert item["protocol_config"] == '{"connect":{"url":"wss://feed.example.com/ws?x=1"}}'


def test_plugin_protocol_by_its_key(table: list[str], local_env: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "firehose.yaml"
    path.write_text(
        "protocol: atproto-firehose/1\n"
        "url: wss://bsky.network/xrpc/com.atproto.sync.subscribeRepos\n"
        "start: oldest\n"
    )
    added(run(*table, "connections", "add", "fh", "--config", str(path), env=local_env), "fh")
    item = items_of(table, local_env)["fh"]
    assert item["protocol"] == "atproto-firehose/1"
    assert item["ws_url"] == "wss://bsky.network/xrpc/com.atproto.sync.subscribeRepos"
    assert json.loads(str(item["protocol_config"])) == {"start": "oldest"}
    bad = tmp_path / "bad-firehose.yaml"
    bad.write_text("protocol: atproto-firehose/1\nstart: yesterday\n")
    line = one_error_line(run(*table, "connections", "add", "fh2", "--config", str(bad), env=local_env), 2)
    assert "url" in line and "atproto-firehose/1 needs the upstream address" in line
    bad.write_text("protocol: atproto-firehose/1\nurl: wss://h.example/x\nstart: yesterday\n")
    line = one_error_line(run(*table, "connections", "add", "fh2", "--config", str(bad), env=local_env), 2)
    assert line == "error: start: must be 'live' or 'oldest'"
    assert "fh2" not in items_of(table, local_env)


BAD_CONFIGS = [
    (
        "connect:\n  url: wss://h.example/x\n"
        "frames:\n  classify:\n    - when: {/a: 1}\n      action: explode\n",
        "error: frames.classify[0].action: must be one of",
    ),
    ("connect: {}\n", "error: connect.url:"),
    ("connect:\n  url: https://h.example/x\n", "error: connect.url: must start with ws:// or wss://"),
    ("connect:\n  url: wss://h.example/x\nwhatever: 1\n", "whatever"),
    ("protocol: nope/9\nconnect:\n  url: wss://h.example/x\n", "error: protocol: unknown protocol 'nope/9'"),
    ("protocol: seqfeed/1\n", "error: protocol: seqfeed/1 takes no config: add it with --url URL"),
    ("- just\n- a list\n", "must be a mapping"),
    ("connect: [unclosed\n", "not JSON or YAML: line"),
    (
        "connect:\n  url: wss://h.example/x\n  max_frame_bytes: .nan\n",
        "connect.max_frame_bytes: must be a finite",
    ),
    ("connect:\n  url: wss://h.example/x\nlifetime: {max_age_s: 2026-01-01}\n", "lifetime.max_age_s: a date"),
    (
        "connect:\n  url: wss://h.example/x\n  headers: {X: "
        + json.dumps("y" * (MAX_CONFIG_BYTES + 10))
        + "}\n",
        f"at most {MAX_CONFIG_BYTES}",
    ),
    ("a: &a [*a]\n", "nested too deeply"),
]


def test_bad_configs_one_line_nothing_written(
    table: list[str], local_env: dict[str, str], tmp_path: Path
) -> None:
    commands = []
    for index, (text, _) in enumerate(BAD_CONFIGS):
        path = tmp_path / f"bad-{index}.yaml"
        path.write_text(text)
        commands.append([*table, "connections", "add", f"bad-{index}", "--config", str(path)])
    before = items_of(table, local_env)
    for (_, says), done in zip(BAD_CONFIGS, run_all(commands, local_env), strict=True):
        line = one_error_line(done, 2)
        assert says in line, (says, line)
    missing = one_error_line(
        run(*table, "connections", "add", "bad-x", "--config", str(tmp_path / "none.yaml"), env=local_env), 2
    )
    assert "cannot read --config" in missing
    assert items_of(table, local_env).keys() == before.keys()


def test_bad_presets_one_line_nothing_written(table: list[str], local_env: dict[str, str]) -> None:
    env = {**local_env, "ALPACA_SECRET": SECRET_VALUE}
    cases = [
        (["--preset", "jetstream", "--param", "colections=a.b"], "has no parameter 'colections'"),
        (["--preset", "nosuch"], "unknown preset 'nosuch'"),
        (
            [
                "--preset",
                "alpaca",
                "--param",
                "key={{secret:alpaca#key}}",
                "--param",
                f"secret={SECRET_VALUE}",
            ],
            "parameter 'secret' is a secret: give a reference",
        ),
        (
            ["--preset", "jetstream", "--param", "collections"],
            "invalid --param 'collections': must be NAME=VALUE",
        ),
        (
            ["--preset", "jetstream", "--param", "url=ws://jetstream.example.com/s"],
            "ws:// to non-loopback host",
        ),
        (
            ["--url", "wss://h.example/x", "--preset", "jetstream"],
            "give exactly one of --url, --config or --preset",
        ),
        ([], "give exactly one of --url, --config or --preset"),
        (["--url", "wss://h.example/x", "--param", "a=b"], "--param goes with --preset"),
    ]
    commands = [[*table, "connections", "add", f"p-{index}", *args] for index, (args, _) in enumerate(cases)]
    before = items_of(table, env)
    for (_, says), done in zip(cases, run_all(commands, env), strict=True):
        line = one_error_line(done, 2)
        assert says in line, (says, line)
        assert SECRET_VALUE not in line or "is a secret" in line
    assert items_of(table, env).keys() == before.keys()


def test_insecure_ws_refused_unless_allowed(
    table: list[str], local_env: dict[str, str], tmp_path: Path
) -> None:
    path = tmp_path / "insecure.json"
    path.write_text(json.dumps({"connect": {"url": "ws://feed.example.com/ws?token={{env:TOKEN}}"}}))
    templated = tmp_path / "templated-host.json"
    templated.write_text(json.dumps({"connect": {"url": "ws://{{env:HOST}}/ws"}}))
    done = run_all(
        [
            [*table, "connections", "add", "ins-1", "--url", "ws://feed.example.com/ws"],
            [*table, "connections", "add", "ins-2", "--config", str(path)],
            [*table, "connections", "add", "ins-3", "--config", str(templated)],
        ],
        local_env,
    )
    assert one_error_line(done[0], 2) == (
        "error: url: ws:// to non-loopback host 'feed.example.com' needs ALLOW_INSECURE_WS=true: use wss://"
    )
    assert one_error_line(done[1], 2).startswith("error: connect.url: ws:// to non-loopback host")
    assert "the host is a template" in one_error_line(done[2], 2)
    assert not {"ins-1", "ins-2", "ins-3"} & items_of(table, local_env).keys()

    allowed = {**local_env, "ALLOW_INSECURE_WS": "true"}
    added(run(*table, "connections", "add", "ins-2", "--config", str(path), env=allowed), "ins-2")
    bad_flag = {**local_env, "ALLOW_INSECURE_WS": "maybe"}
    line = one_error_line(run(*table, "connections", "add", "ins-9", "--config", str(path), env=bad_flag), 2)
    assert "invalid ALLOW_INSECURE_WS='maybe'" in line


def test_human_time() -> None:
    now = 1_796_460_012_000  # 2026-12-05 08:40:12 UTC
    assert human_time(now - 12_000, now) == "2026-12-05 08:40:00 UTC (12 s ago)"
    assert human_time(now + 30_000, now) == "2026-12-05 08:40:42 UTC (in 30 s)"
    assert human_time(SESSION_HELD, now) == "held by session"
    assert human_time(0, now) == "-"
