"""Resolved secrets never leave the worker's memory (docs/design.md §4.2 "Secrets"; issue 21 item 5).

A real fleet, judged from outside. This module starts its own DynamoDB Local and moto server
(Secrets Manager, SQS), so that their logs are scanned too. Secrets Manager holds an Alpaca
secret key and a Home Assistant token with distinctive values; the workers' environment holds an
Alpaca key id (`{{env:ALPACA_KEY}}`), also distinctive, and the local replays expect exactly
those values. Three connections are added with the CLI (`connections add --preset`):
- `alp-1`: alpaca, key from the environment, secret from Secrets Manager: authenticates;
- `ha-1`: home-assistant, token from Secrets Manager: authenticates;
- `ha-url`: the home-assistant preset's config with the token ALSO in the URL's query
  (`?access_token={{secret:…}}`), added with `--config` (a preset's `url` takes no template):
  the worker logs the URL it subscribed to, which must show the query value redacted;
- `alp-bad`: alpaca whose secret reference names a secret holding a WRONG (also distinctive)
  value: the replay refuses it (402 "auth failed"), so the auth-refusal path runs: last_error,
  warnings in the logs, the secret invalidated and re-read.
Two `leaseworker run` workers (supervisor + child) with LOG_LEVEL=DEBUG (leaseworker's own
loggers only; botocore stays at WARNING) and a file sink run until data has flowed for a few
seconds and the refusal has reached last_error; then both get SIGTERM.

Then every value, in every form it could take in text (as is, URL-encoded both ways, JSON-escaped
with and without ensure_ascii, Python repr, and its distinctive core alone, which catches a
truncated or re-encoded copy), is looked for in: every process's stdout/stderr (the workers'
supervisor and child, each CLI call, moto, DynamoDB Local), every sink file, every item of every
table of DynamoDB Local (a full scan, all attributes, in DynamoDB's JSON), the output of
`connections list`, `list --json`, `show ID` and `show ID --json` for each connection, and the
EMF metric lines (in the workers' stdout; asserted to be there, so they are scanned). None may
be found. Positively: both good feeds delivered data records, the bad one none and has a
last_error naming the refusal; and (negative control) the same scanner finds each form of each
value once it is written into a copy of a worker's log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import botocore.session
import pytest

from leaseworker.protocol.presets import expand
from leaseworker_dev.local.fleet import FAST
from leaseworker_dev.local.services import (
    LOCAL_CREDENTIALS,
    ManagedProcess,
    start_dynamodb_local,
    start_moto_server,
)
from tests.system.feeds_fleet import FeedsFleet, wait_until

# Distinctive values. Each has a core (`7f1c9e…`) found nowhere else: not in a secret's name,
# a reference, a connection id or a replay's message. `/`, `+`, `=`, `&` change under URL
# encoding, `"` under JSON escaping, `é` under JSON's ensure_ascii.
ALPACA_KEY = 'AKenv-VALUE-3b9d4a0c/+=&é"K'
ALPACA_SECRET = 's3cr3t-VALUE-7f1c9e52/+=&é"S'
HA_TOKEN = 'hatok-VALUE-c0ffee71/+=&é"T'
WRONG_SECRET = 'wrong-VALUE-d15ea5e8/+=&é"W'
VALUES = {
    "ALPACA_KEY (env)": (ALPACA_KEY, "3b9d4a0c"),
    "alpaca secret (Secrets Manager)": (ALPACA_SECRET, "7f1c9e52"),
    "home-assistant token (Secrets Manager)": (HA_TOKEN, "c0ffee71"),
    "wrong alpaca secret (Secrets Manager)": (WRONG_SECRET, "d15ea5e8"),
}

GOOD_ALPACA, HOME, BAD_ALPACA, HOME_URL = "alp-1", "ha-1", "alp-bad", "ha-url"
VIEWS_OF = (GOOD_ALPACA, HOME, BAD_ALPACA, HOME_URL)
FLOW_S = 4.0  # data flows this long once both good feeds deliver


def forms(value: str, core: str) -> dict[str, str]:
    """Every textual form a leaked value could take; keyed by a name for the report."""
    return {
        "as is": value,
        "URL-encoded": urllib.parse.quote(value, safe=""),
        "URL-encoded (plus)": urllib.parse.quote_plus(value),
        "URL-encoded (path)": urllib.parse.quote(value),
        "JSON-escaped": json.dumps(value)[1:-1],
        "JSON-escaped (UTF-8)": json.dumps(value, ensure_ascii=False)[1:-1],
        "repr": repr(value)[1:-1],
        "core": core,
    }


def scan(where: str, text: str) -> list[str]:
    """Every (value, form) found in `text`, as 'where: value (form)'."""
    found = []
    for label, (value, core) in VALUES.items():
        for form_name, form in forms(value, core).items():
            if form in text:
                found.append(f"{where}: {label} ({form_name})")
    return found


# ----------------------------------------------------------------------------- servers


@dataclass
class Servers:
    dynamodb: ManagedProcess
    moto: ManagedProcess
    logs: list[Path]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """This module's own DynamoDB Local and moto, so that their logs can be scanned too."""
    root = Path(tmp_path_factory.mktemp("leak-servers"))
    dynamodb = start_dynamodb_local(log_path=root / "dynamodb-local.log")
    try:
        moto = start_moto_server(log_path=root / "moto.log")
        try:
            yield Servers(dynamodb, moto, [root / "dynamodb-local.log", root / "moto.log"])
        finally:
            moto.stop()
    finally:
        dynamodb.stop()


def client(service: str, endpoint: str) -> Any:
    return botocore.session.get_session().create_client(
        service,
        endpoint_url=endpoint,
        region_name=LOCAL_CREDENTIALS["AWS_REGION"],
        aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )


# ----------------------------------------------------------------------------- the CLI


@dataclass
class CliRun:
    argv: list[str]
    returncode: int
    out: str
    err: str


class Cli:
    """`python -m leaseworker …` in the fleet's environment; every output kept for the scan."""

    def __init__(self, fleet: FeedsFleet, env: dict[str, str]) -> None:
        self.fleet = fleet
        self.env = env
        self.runs: list[CliRun] = []

    def start(self, *args: str) -> tuple[list[str], subprocess.Popen[str]]:
        argv = [sys.executable, "-m", "leaseworker", *args]
        popen = subprocess.Popen(
            argv,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        return argv, popen

    def finish(self, argv: list[str], popen: subprocess.Popen[str]) -> CliRun:
        out, err = popen.communicate(timeout=60)
        run = CliRun(argv, popen.returncode, out, err)
        self.runs.append(run)
        assert run.returncode == 0, (argv, out, err)
        return run

    def __call__(self, *args: str) -> CliRun:
        return self.finish(*self.start(*args))

    def parallel(self, *commands: tuple[str, ...]) -> list[CliRun]:
        started = [self.start(*args) for args in commands]
        return [self.finish(argv, popen) for argv, popen in started]


# ----------------------------------------------------------------------------- the test


@pytest.fixture
def fleet(
    tmp_path: Path, servers: Servers, marker: str, request: pytest.FixtureRequest
) -> Iterator[FeedsFleet]:
    mode = request.node.callspec.params["mode"]
    running = FeedsFleet(tmp_path, servers.dynamodb.url, servers.moto.url, marker, mode, FAST)
    try:
        running.start(
            {
                "alpaca": {"rate": 10.0, "key": ALPACA_KEY, "secret": ALPACA_SECRET},
                "home-assistant": {"rate": 10.0, "token": HA_TOKEN},
            }
        )
        yield running
    finally:
        running.close()


def sink_records(fleet: FeedsFleet) -> list[dict[str, Any]]:
    records = []
    for path in sorted(fleet.sink_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                records.append(json.loads(line))
    return records


def raw(fleet: FeedsFleet, cid: str) -> dict[str, Any]:
    item: dict[str, Any] | None = fleet.admin.call(lambda admin: admin.raw_item(cid))
    return item or {}


def data_from(fleet: FeedsFleet, cid: str) -> int:
    return sum(1 for a in fleet.tailer.arrivals() if a.cid == cid and a.record["kind"] == "data")


def scan_table(ddb: Any) -> tuple[str, int]:
    """Every item of every table in DynamoDB Local, all attributes, in DynamoDB's JSON."""
    items: list[dict[str, Any]] = []
    for table in ddb.list_tables()["TableNames"]:
        for page in ddb.get_paginator("scan").paginate(TableName=table, ConsistentRead=True):
            items.extend({"__table": {"S": table}, **item} for item in page["Items"])

    def plain(value: Any) -> Any:  # bytes (a B or BS attribute) as text, so a value inside shows
        if isinstance(value, bytes):
            return value.decode("utf-8", errors="replace")
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list | set):
            return [plain(v) for v in value]
        return value

    dumped = [json.dumps(plain(item), ensure_ascii=False, default=str) for item in items]
    return "\n".join(dumped), len(items)


@pytest.mark.parametrize("mode", ["session", "connection"])
def test_secret_values_never_leak(fleet: FeedsFleet, servers: Servers, mode: str) -> None:
    started = time.monotonic()
    assert fleet.replays is not None
    alpaca = fleet.replays.servers["alpaca"]
    home = fleet.replays.servers["home-assistant"]

    # Secrets Manager holds the secret values (JSON members); unique names per run.
    run_id = uuid.uuid4().hex[:8]
    sm = client("secretsmanager", servers.moto.url)
    alpaca_name, ha_name, wrong_name = (f"lw-leak-{run_id}/{n}" for n in ("alpaca", "ha", "alpaca-wrong"))
    sm.create_secret(Name=alpaca_name, SecretString=json.dumps({"secret": ALPACA_SECRET, "other": "x"}))
    sm.create_secret(Name=ha_name, SecretString=json.dumps({"token": HA_TOKEN}))
    sm.create_secret(Name=wrong_name, SecretString=json.dumps({"secret": WRONG_SECRET}))

    # The CLI's environment holds ALPACA_KEY too: `add` must store the reference, never the value.
    cli_env = fleet.env("cli", {"ALPACA_KEY": ALPACA_KEY})
    cli = Cli(fleet, cli_env)
    add = ("connections", "add")
    cli.parallel(
        (*add, GOOD_ALPACA, "--preset", "alpaca", "--param", "key={{env:ALPACA_KEY}}",
         "--param", f"secret={{{{secret:{alpaca_name}#secret}}}}", "--param", "symbols=AAPL,MSFT",
         "--param", f"url={alpaca.url}"),
        (*add, HOME, "--preset", "home-assistant", "--param", f"token={{{{secret:{ha_name}#token}}}}",
         "--param", f"url={home.url}"),
        (*add, BAD_ALPACA, "--preset", "alpaca", "--param", "key={{env:ALPACA_KEY}}",
         "--param", f"secret={{{{secret:{wrong_name}#secret}}}}", "--param", "symbols=TSLA",
         "--param", f"url={alpaca.url}"),
    )  # fmt: skip
    # The token in the URL's query too: a generic/1 file, the preset's config with its URL changed.
    config = expand("home-assistant", {"url": home.url, "token": f"{{{{secret:{ha_name}#token}}}}"})
    config["connect"]["url"] = f"{home.url}?v=1&access_token={{{{secret:{ha_name}#token}}}}"
    config_file = fleet.root / "ha-url.json"
    config_file.write_text(json.dumps(config))
    cli(*add, HOME_URL, "--config", str(config_file))

    worker_env = {
        "ALPACA_KEY": ALPACA_KEY,
        "AWS_ENDPOINT_URL_SECRETS_MANAGER": servers.moto.url,
        "LOG_LEVEL": "DEBUG",  # leaseworker's loggers only; botocore's stay at WARNING
        "METRICS_SECONDS": "1",
    }
    workers = [fleet.start_worker(name, worker_env) for name in ("w1", "w2")]

    wait_until(
        lambda: all(data_from(fleet, cid) >= 10 for cid in (GOOD_ALPACA, HOME, HOME_URL)),
        30,
        "both good feeds to authenticate and deliver",
    )
    wait_until(
        lambda: bool(raw(fleet, BAD_ALPACA).get("last_error")),
        30,
        "the refused connection's last_error",
    )
    time.sleep(FLOW_S)

    # `list`, `list --json`, `show` and `show --json` of each, while the workers run.
    views = ["list", "list --json", *(f"show {c}" for c in VIEWS_OF)]
    views += [f"show {c} --json" for c in VIEWS_OF]
    shown = cli.parallel(*(("connections", *v.split()) for v in views))

    for worker in workers:
        os.kill(worker.popen.pid, signal.SIGTERM)  # the supervisor forwards it
    for worker in workers:
        assert fleet.wait_exit(worker.name, 20) == 0, worker.tail()
    fleet.tailer.stop()
    bad_item = raw(fleet, BAD_ALPACA)

    # Positively: the good feeds authenticated and delivered; the bad one was refused.
    records = sink_records(fleet)
    data = {c: [r for r in records if r["connection_id"] == c and r["kind"] == "data"] for c in VIEWS_OF}
    assert len(data[GOOD_ALPACA]) >= 10 and {r["data"]["S"] for r in data[GOOD_ALPACA]} == {"AAPL", "MSFT"}, (
        len(data[GOOD_ALPACA])
    )
    assert len(data[HOME]) >= 10 and all(r["data"]["event_type"] == "state_changed" for r in data[HOME])
    assert len(data[HOME_URL]) >= 10, len(data[HOME_URL])
    assert not data[BAD_ALPACA], data[BAD_ALPACA][:2]
    assert "auth failed" in str(bad_item.get("last_error")), bad_item
    logs = {path.name: path.read_text(errors="replace") for path in sorted(fleet.logs.glob("*.log"))}
    assert any("auth failed" in text for text in logs.values()), "the refusal never reached a log"
    subscribed_urls = [
        str(json.loads(line).get("url"))
        for text in logs.values()
        for line in text.splitlines()
        if '"subscribed"' in line and HOME_URL in line
    ]
    assert subscribed_urls, "no `subscribed` line of ha-url (the URL's log line)"
    assert all("access_token=" in str(url) for url in subscribed_urls), subscribed_urls
    emf = [
        line
        for text in logs.values()
        for line in text.splitlines()
        if line.startswith("{") and '"_aws"' in line and '"CloudWatchMetrics"' in line
    ]
    assert emf, "no EMF metric lines to scan"
    assert all(json.loads(view.out) for view in shown if "--json" in view.argv)
    refused_auths = [e for e in alpaca.ledger.entries if e.kind == "close" and e.code == 1008]
    assert refused_auths, "the alpaca replay never refused an auth"

    # The scan.
    found: list[str] = []
    for name, text in logs.items():
        found += scan(f"worker log {name} (supervisor + child stdout/stderr)", text)
    for index, line in enumerate(emf):
        found += scan(f"EMF line {index}", line)
    for path in servers.logs:
        found += scan(f"server log {path.name}", path.read_text(errors="replace"))
    for path in sorted(fleet.sink_dir.glob("*.jsonl")):
        found += scan(f"sink file {path.name}", path.read_text(errors="replace"))
    for run in cli.runs:
        args = run.argv[3:]
        command = " ".join(args[:3] + (["--json"] if "--json" in args else []))
        found += scan(f"CLI `{command}` stdout", run.out)
        found += scan(f"CLI `{command}` stderr", run.err)
    table_dump, item_count = scan_table(client("dynamodb", servers.dynamodb.url))
    assert item_count >= 5, item_count  # 3 connections and at least the 2 workers' items
    assert all(cid in table_dump for cid in VIEWS_OF)
    # What was scanned holds the references where the values would have been: the stored
    # configs (table, `list --json`, `show`) are really in the scanned text.
    for name in (alpaca_name, ha_name, wrong_name):
        assert f"secret:{name}#" in table_dump, name
        assert any(f"secret:{name}#" in view.out for view in shown if view.argv[-1] == "--json"), name
    assert "{{env:ALPACA_KEY}}" in table_dump
    found += scan(f"DynamoDB Local full scan ({item_count} items)", table_dump)

    # Negative control: the same scanner finds every form of every value written into a copy of
    # a worker's log (and nothing in the untouched copy).
    original = logs["w1.log"]
    assert not scan("copy", original)
    copy = fleet.root / "w1.copy.log"
    for label, (value, core) in VALUES.items():
        for form_name, form in forms(value, core).items():
            copy.write_text(f'{original}{{"level":"INFO","message":"x{form}y"}}\n')
            hits = scan("copy", copy.read_text())
            assert f"copy: {label} ({form_name})" in hits, (label, form_name, hits)

    elapsed = time.monotonic() - started
    print(
        f"\nsecrets-never-leak {mode}: {elapsed:.1f} s; data alp-1 {len(data[GOOD_ALPACA])}, "
        f"ha-1 {len(data[HOME])}, ha-url {len(data[HOME_URL])}; urls logged {sorted(set(subscribed_urls))}; "
        f"{len(emf)} EMF lines; {len(cli.runs)} CLI calls; "
        f"{item_count} table items; last_error {bad_item.get('last_error')!r}; "
        f"failures {bad_item.get('failures')}; desired_state {bad_item.get('desired_state')}"
    )
    assert not found, "\n".join(found)
