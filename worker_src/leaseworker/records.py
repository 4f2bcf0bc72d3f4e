"""The unit of delivery: one upstream message, stamped with who delivered it under which lease."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SinkRecord:
    """DESIGN.md §5: `{connection_id, seq, epoch, worker_id, received_at_ms, data}`."""

    connection_id: str
    seq: int
    epoch: int
    worker_id: str
    received_at_ms: int
    data: Any

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)
