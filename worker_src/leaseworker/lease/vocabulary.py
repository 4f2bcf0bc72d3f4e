"""The lease table's vocabulary, spelled once (docs/design.md §2): its key, indexes, reserved key
prefixes, the session-held marker, the TTL attribute and the checkpoint item's entry limits.

It imports nothing, so the CDK app (stacks/vocabulary.py) loads this very file without
installing the worker, and the table it deploys cannot drift from the one the worker queries.
"""

TABLE_KEY = "connection_id"
# KEYS_ONLY; PK desired_state, SK lease_expires_at_ms: expired STARTED connections, and the workers'
# session items in their own WORKER partition.
INDEX_BY_STATE_EXPIRY = "by-state-expiry"
INDEX_BY_STATE_EXPIRY_PK = "desired_state"
INDEX_BY_STATE_EXPIRY_SK = "lease_expires_at_ms"
# KEYS_ONLY and sparse; PK lease_owner: what one worker holds.
INDEX_BY_OWNER = "by-owner"
INDEX_BY_OWNER_PK = "lease_owner"
INDEXES = (INDEX_BY_STATE_EXPIRY, INDEX_BY_OWNER)
# The table as CreateTable states it: `leaseworker table create` sends this, and
# tests/infra checks that the stack deploys the same keys and indexes.
TABLE_SCHEMA = {
    "AttributeDefinitions": [
        {"AttributeName": TABLE_KEY, "AttributeType": "S"},
        {"AttributeName": INDEX_BY_STATE_EXPIRY_PK, "AttributeType": "S"},
        {"AttributeName": INDEX_BY_STATE_EXPIRY_SK, "AttributeType": "N"},
        {"AttributeName": INDEX_BY_OWNER_PK, "AttributeType": "S"},
    ],
    "KeySchema": [{"AttributeName": TABLE_KEY, "KeyType": "HASH"}],
    "GlobalSecondaryIndexes": [
        {
            "IndexName": INDEX_BY_STATE_EXPIRY,
            "KeySchema": [
                {"AttributeName": INDEX_BY_STATE_EXPIRY_PK, "KeyType": "HASH"},
                {"AttributeName": INDEX_BY_STATE_EXPIRY_SK, "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "KEYS_ONLY"},
        },
        {
            "IndexName": INDEX_BY_OWNER,
            "KeySchema": [{"AttributeName": INDEX_BY_OWNER_PK, "KeyType": "HASH"}],
            "Projection": {"ProjectionType": "KEYS_ONLY"},
        },
    ],
}
# Epoch seconds on the workers' own items (sessions, checkpoints, budgets): DynamoDB deletes
# those of workers gone for good. Connection items never carry it.
TTL_ATTRIBUTE = "purge_at"

WORKER_KEY_PREFIX = "worker#"  # a worker's session item, and its checkpoint item
BUDGET_KEY_PREFIX = "budget#"  # the fleet's connect budget per upstream host (lease/budget_store.py)
RESERVED_KEY_PREFIXES = (WORKER_KEY_PREFIX, BUDGET_KEY_PREFIX)  # never a connection's item
CHECKPOINT_KEY_SUFFIX = "#ckpt"  # worker#<id>#ckpt: the session-mode checkpoint item
WORKER_STATE = "WORKER"  # session items' desired_state: their own partition of by-state-expiry

# Session mode: a held connection item's expiry. No connection-mode acquirer ever sees it as
# expired; the largest integer every JSON/float consumer reads exactly.
SESSION_HELD = 2**53 - 1

LEASE_MODES = ("connection", "session")

# One worker's session-mode checkpoints share one item (docs/design.md §2b), so they bound how
# many connections one worker may hold. A checkpoint cursor (JSON text, §5) rides in the entry
# beside its seq, capped so that the largest MAX_CONNECTIONS still fits.
ITEM_LIMIT_BYTES = 400 * 1024
RESERVED_BYTES = 4 * 1024  # the key, purge_at, updated_at_ms, the fence and writer attributes
MAX_CURSOR_BYTES = 200
WORST_ENTRY_BYTES = 160 + MAX_CURSOR_BYTES + 3  # 128-byte id, list overhead, two numbers; the cursor
MAX_ENTRIES_PER_ITEM = (ITEM_LIMIT_BYTES - RESERVED_BYTES) // WORST_ENTRY_BYTES  # 1117
