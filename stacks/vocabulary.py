"""The lease table's vocabulary, from the worker's own module (worker_src/leaseworker/lease/vocabulary.py).

That module imports nothing, so the CDK app loads the file itself: synth and deploy need no
worker install, and the table, its indexes and the session-mode limit deployed here are the
ones the worker queries and enforces.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).resolve().parents[1] / "worker_src" / "leaseworker" / "lease" / "vocabulary.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("leaseworker_lease_vocabulary", SOURCE)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the lease vocabulary from {SOURCE}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_vocabulary = _load()

TABLE_KEY: str = _vocabulary.TABLE_KEY
INDEX_BY_STATE_EXPIRY: str = _vocabulary.INDEX_BY_STATE_EXPIRY
INDEX_BY_STATE_EXPIRY_PK: str = _vocabulary.INDEX_BY_STATE_EXPIRY_PK
INDEX_BY_STATE_EXPIRY_SK: str = _vocabulary.INDEX_BY_STATE_EXPIRY_SK
INDEX_BY_OWNER: str = _vocabulary.INDEX_BY_OWNER
INDEX_BY_OWNER_PK: str = _vocabulary.INDEX_BY_OWNER_PK
INDEXES: tuple[str, ...] = tuple(_vocabulary.INDEXES)
TTL_ATTRIBUTE: str = _vocabulary.TTL_ATTRIBUTE
LEASE_MODES: tuple[str, ...] = tuple(_vocabulary.LEASE_MODES)
MAX_ENTRIES_PER_ITEM: int = _vocabulary.MAX_ENTRIES_PER_ITEM
