"""The local fleet's services leave nothing outside their processes (issue 23, `make demo` side
effects): DynamoDB Local's JVM writes no /tmp/hsperfdata_<user>/<pid> file, which a killed JVM
would leave behind."""

from __future__ import annotations

import getpass
from pathlib import Path

from leaseworker_dev.local.services import start_dynamodb_local


def test_dynamodb_local_writes_no_perf_data_file() -> None:
    process = start_dynamodb_local()
    try:
        # HotSpot writes it under /tmp whatever TMPDIR says.
        perf = Path("/tmp") / f"hsperfdata_{getpass.getuser()}" / str(process.pid)
        assert process.alive()
        assert not perf.exists(), perf
    finally:
        process.stop()
