"""`connections apply` of 10,000 entries against DynamoDB Local: the time to create, the time of
a second (idempotent) apply, and the time to update every one; the target is ≤ 60 s to create.

The file mixes what a team keeps in git: seqfeed/1 URLs (8 in 10), presets with parameters (1 in
10, coinbase-exchange) and inline generic/1 configs (1 in 10). Each row runs the installed
`leaseworker` as a subprocess, piped (no progress bar), on a fresh table of its own DynamoDB
Local, and times it from the outside, interpreter start-up included. Run it alone on the machine:

    flock /tmp/lw-system.lock .venv/bin/python -m bench.apply_10k [--entries N] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from leaseworker_dev.local.services import LOCAL_CREDENTIALS, start_dynamodb_local

LEASEWORKER = Path(sys.executable).with_name("leaseworker")
TARGET_SECONDS = 60.0


def document(entries: int, version: str) -> dict[str, Any]:
    connections: list[dict[str, Any]] = []
    for index in range(entries):
        cid = f"feed-{index:05d}"
        if index % 10 == 8:
            connections.append(
                {
                    "id": cid,
                    "preset": "coinbase-exchange",
                    "params": {"product_ids": ["BTC-USD", f"X{index}-USD"]},
                }
            )
        elif index % 10 == 9:
            url = f"wss://iot.example.com/{version}/{cid}"
            connections.append({"id": cid, "config": {"connect": {"url": url}}})
        else:
            connections.append({"id": cid, "url": f"wss://feeds.example.com/{version}/{cid}"})
    return {"connections": connections}


def timed(*args: str, env: dict[str, str]) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(
        [str(LEASEWORKER), *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"leaseworker {' '.join(args)} failed ({done.returncode}): {done.stderr[-500:]}")
    return elapsed, done.stdout.splitlines()[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=None)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lw-apply-bench-") as scratch:
        directory = Path(scratch)
        first, second = directory / "feeds.json", directory / "feeds-v2.json"
        first.write_text(json.dumps(document(options.entries, "v1")))
        second.write_text(json.dumps(document(options.entries, "v2")))
        server = start_dynamodb_local(log_path=directory / "dynamodb-local.log")
        try:
            env = {**os.environ, **LOCAL_CREDENTIALS, "AWS_REGION": "us-east-1"}
            env.pop("NOTIFY_QUEUE_URL", None)
            target = ["--endpoint-url", server.url, "--table", "apply-bench"]
            timed(*target, "table", "create", env=env)
            rows: dict[str, dict[str, Any]] = {}
            for name, path in (("create", first), ("again", first), ("update", second)):
                seconds, summary = timed(*target, "connections", "apply", "-f", str(path), env=env)
                rows[name] = {"seconds": round(seconds, 2), "summary": summary}
                print(f"{name:>7}: {seconds:6.1f} s  {summary}", flush=True)
        finally:
            server.stop()
    result = {
        "entries": options.entries,
        "target_seconds": TARGET_SECONDS,
        "met": rows["create"]["seconds"] <= TARGET_SECONDS,
        "rows": rows,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if options.out is not None:
        options.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
