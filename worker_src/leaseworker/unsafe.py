"""Negative controls for the fault suite (issue 11): test-only switches that break a safety rule.

A checker that never fails proves nothing. The chaos suite runs the same seeded schedule with one
of these switched on and must then FAIL with the violation named. They exist only for that.

- `self-fencing`: every local deadline (DESIGN.md §2d, per lease and per session) moves
  UNSAFE_EXTRA_VALIDITY_SECONDS later, so the fence timer never fires and `valid()` stays true:
  a paused or partitioned worker keeps delivering after its peers took over. The chaos suite
  expects S1 to fail.
- `checkpoint-epoch`: connection mode's checkpoint write loses its owner/epoch condition (and the
  `last_seq < :seq` clause that is part of it): a deposed owner's late checkpoint lands over the
  new owner's. The chaos suite expects S3 to fail. Session mode's batched checkpoints are untouched.

Both are read once at start from the environment, never from settings, cdk.json or the CDK
context: LEASEWORKER_UNSAFE_TEST_ONLY_DISABLE=<comma list> is refused (the worker does not start)
unless LEASEWORKER_UNSAFE_I_KNOW=yes is also set, and an active switch is logged at ERROR.
The switches patch two named places (Settings.fence_margin_seconds, store.COND_CHECKPOINT) and
fail loudly if those ever move, so no production module carries a test branch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from leaseworker.lease import store
from leaseworker.observability.logging import get_logger
from leaseworker.settings import Settings, SettingsError

logger = get_logger(__name__)

DISABLE_VAR: Final = "LEASEWORKER_UNSAFE_TEST_ONLY_DISABLE"
CONFIRM_VAR: Final = "LEASEWORKER_UNSAFE_I_KNOW"
CONFIRM_VALUE: Final = "yes"
SELF_FENCING: Final = "self-fencing"
CHECKPOINT_EPOCH: Final = "checkpoint-epoch"
SWITCHES: Final = frozenset({SELF_FENCING, CHECKPOINT_EPOCH})
UNSAFE_EXTRA_VALIDITY_SECONDS: Final = 1_000_000.0  # ~11.6 days: "never" for any test run
# The checkpoint condition with the fencing token (owner, epoch) and the monotonic clause made moot:
# true for any existing item. It still names :me, :epoch and :seq, because DynamoDB refuses a
# request whose ExpressionAttributeValues holds a value no expression uses.
COND_CHECKPOINT_UNFENCED: Final = f"{store.COND_EXISTS} OR ({store.COND_CHECKPOINT})"


def requested(environ: Mapping[str, str]) -> frozenset[str]:
    """The switches the environment asks for; SettingsError if unknown or not confirmed."""
    raw = environ.get(DISABLE_VAR, "").strip()
    if not raw:
        return frozenset()
    names = frozenset(part.strip() for part in raw.split(",") if part.strip())
    unknown = names - SWITCHES
    if unknown:
        raise SettingsError(
            DISABLE_VAR, raw, f"unknown switch(es) {sorted(unknown)}; known: {sorted(SWITCHES)}"
        )
    if environ.get(CONFIRM_VAR) != CONFIRM_VALUE:
        raise SettingsError(
            DISABLE_VAR,
            raw,
            f"refused: a test-only switch that breaks safety needs {CONFIRM_VAR}={CONFIRM_VALUE}",
        )
    return names


def apply_from_environment(environ: Mapping[str, str]) -> frozenset[str]:
    """Called once at worker start. Returns the switches now active (normally none)."""
    names = requested(environ)
    if SELF_FENCING in names:
        _disable_self_fencing()
    if CHECKPOINT_EPOCH in names:
        _disable_checkpoint_epoch()
    for name in sorted(names):
        logger.error(
            "UNSAFE TEST-ONLY SWITCH ACTIVE: safety is OFF in this worker; never run it in production",
            extra={"disabled": name, "env": DISABLE_VAR},
        )
    return names


def _disable_self_fencing() -> None:
    original = Settings.__dict__.get("fence_margin_seconds")
    if not isinstance(original, property) or original.fget is None:
        raise RuntimeError("unsafe: Settings.fence_margin_seconds is no longer a property; update unsafe.py")
    margin = original.fget

    def unsafe_margin(settings: Settings) -> float:
        return float(margin(settings)) - UNSAFE_EXTRA_VALIDITY_SECONDS

    # Both deadlines (lease: local_validity_seconds; session: session_deadline) subtract this margin.
    setattr(Settings, "fence_margin_seconds", property(unsafe_margin))  # noqa: B010


def _disable_checkpoint_epoch() -> None:
    if not hasattr(store, "COND_CHECKPOINT"):
        raise RuntimeError("unsafe: lease.store.COND_CHECKPOINT is gone; update unsafe.py")
    store.COND_CHECKPOINT = COND_CHECKPOINT_UNFENCED  # read at call time by LeaseStore.checkpoint
