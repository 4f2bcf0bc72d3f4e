"""moto's server, with one race fixed: the local stand-in for SQS, Kinesis and CloudWatch.

moto 5.2's Kinesis `Shard.put_record` reads the shard's highest sequence number and stores the
new record under that number + 1, without a lock, while `moto.server` serves requests on many
threads. Two PutRecords landing at once can then take the same sequence number, and one record
silently replaces the other: a "lost" record that no worker lost (seen here as a one-seq gap in
a system test judged in shard order). Serialising `put_record` per process restores what
Kinesis guarantees, an ordered shard without holes; everything else is moto as shipped.

    python -m leaseworker.local.moto_server -H 127.0.0.1 -p PORT
"""

from __future__ import annotations

import functools
import threading
from typing import Any


def _serialise_shard_writes() -> None:
    from moto.kinesis import models

    original = models.Shard.put_record
    lock = threading.Lock()

    @functools.wraps(original)
    def put_record(self: Any, *args: Any, **kwargs: Any) -> str:
        with lock:
            return original(self, *args, **kwargs)

    models.Shard.put_record = put_record  # type: ignore[method-assign]


def main() -> None:
    _serialise_shard_writes()
    from moto.server import main as moto_main

    moto_main()


if __name__ == "__main__":
    main()
