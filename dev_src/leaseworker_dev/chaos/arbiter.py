"""The one arbiter of arrival order: a moto server whose Kinesis assigns sequence numbers atomically.

moto's `Shard.put_record` reads the highest sequence number and stores the record under it + 1
without a lock, while its server handles requests on threads: two PutRecords that race get one
sequence number, and the second record silently replaces the first. The chaos suite found it as
an S2 "missing seq" inside one uninterrupted upstream session (moto 5.2.5). This server is moto's
own, started the way leaseworker_dev.local.services starts it, with that one method serialized.

moto is a local-only extra that the image never installs, so it is only ever imported by the
child process below (the worker package must not import it: tests/image/test_import_closure.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

from leaseworker_dev.local.services import SERIAL_MOTO, ManagedProcess, _wait_http, free_port, spawn


def start_arbiter(*, log_path: Path | None = None, timeout: float = 30.0) -> ManagedProcess:
    port = free_port()
    argv = [sys.executable, "-c", SERIAL_MOTO, "-H", "127.0.0.1", "-p", str(port)]
    process = spawn("moto-kinesis-arbiter", argv, port=port, log_path=log_path)
    _wait_http(f"http://127.0.0.1:{port}/moto-api/", process, timeout)
    return process
