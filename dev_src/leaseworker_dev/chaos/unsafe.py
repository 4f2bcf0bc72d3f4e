"""Negative controls for the fault suite (issue 11): test-only switches that break a safety rule.

A checker that never fails proves nothing. The chaos suite runs the same seeded schedule with one
of these switched on and must then FAIL with the violation named. They exist only for that.

- `self-fencing`: every local deadline (docs/design.md §2d, per lease and per session) moves
  UNSAFE_EXTRA_VALIDITY_SECONDS later, so the fence timer never fires and `valid()` stays true:
  a paused or partitioned worker keeps delivering after its peers took over. The chaos suite
  expects S1 to fail.
- `checkpoint-epoch`: connection mode's checkpoint write loses its owner/epoch condition (and the
  `last_seq < :seq` clause that is part of it): a deposed owner's late checkpoint lands over the
  new owner's. The chaos suite expects S3 to fail. Session mode's batched checkpoints are untouched.
- `lost-claim` (issue 20): a claim whose reply was lost (AcquireUncertain) is dropped without
  being read back (`Acquirer._resolve` returns None), AND the anti-entropy audit does nothing
  (`Audit.round` returns 0): review 2026-12-05 finding A, with its safety net gone. In session
  mode the item stays held by a live session nobody serves. The chaos suite expects the
  stranding row (L1 no stranding) to fail.
- `takeover-resume` (issue 20): a takeover from a fenced peer ignores the dead holder's
  checkpoint entry (`worker.peers.resume_seq` returns -1), so it resumes from the item's
  claim-time `last_seq` (review finding C1's kind). The chaos suite expects S3 to fail with the
  effective checkpoint moving back across an owner change (chaos/table_history.py).
- `releasing-entry` (issue 20): session mode's checkpoint rounds leave out every lease being
  released (`Checkpointer.round` sees the registry without RELEASING leases), so the entry is
  dropped while the item still names the worker (review finding C2). The chaos suite expects S3
  to fail with an entry dropped while held.

They are reachable from one entry point only, the chaos runner's worker
(`python -m leaseworker_dev.chaos.unsafe_worker`, chaos/unsafe_worker.py); `leaseworker run` never
reads them. That entry point reads them once at start from the environment, never from settings,
cdk.json or the CDK context: LEASEWORKER_UNSAFE_TEST_ONLY_DISABLE=<comma list> is refused (the
worker does not start) unless LEASEWORKER_UNSAFE_I_KNOW=yes is also set, and an active switch is
logged at ERROR.
The switches patch two named places (Settings.fence_margin_seconds,
connection_expressions.COND_CHECKPOINT) and fail loudly if those ever move, so no production module
carries a test branch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from leaseworker.lease import connection_expressions
from leaseworker.observability.logging import get_logger
from leaseworker.settings import Settings, SettingsError

logger = get_logger(__name__)

DISABLE_VAR: Final = "LEASEWORKER_UNSAFE_TEST_ONLY_DISABLE"
CONFIRM_VAR: Final = "LEASEWORKER_UNSAFE_I_KNOW"
CONFIRM_VALUE: Final = "yes"
SELF_FENCING: Final = "self-fencing"
CHECKPOINT_EPOCH: Final = "checkpoint-epoch"
LOST_CLAIM: Final = "lost-claim"
TAKEOVER_RESUME: Final = "takeover-resume"
RELEASING_ENTRY: Final = "releasing-entry"
SWITCHES: Final = frozenset({SELF_FENCING, CHECKPOINT_EPOCH, LOST_CLAIM, TAKEOVER_RESUME, RELEASING_ENTRY})
UNSAFE_EXTRA_VALIDITY_SECONDS: Final = 1_000_000.0  # ~11.6 days: "never" for any test run
# The checkpoint condition with the fencing token (owner, epoch) and the monotonic clause made moot:
# true for any existing item. It still names :me, :epoch and :seq, because DynamoDB refuses a
# request whose ExpressionAttributeValues holds a value no expression uses.
COND_CHECKPOINT_UNFENCED: Final = (
    f"{connection_expressions.COND_EXISTS} OR ({connection_expressions.COND_CHECKPOINT})"
)


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
    if LOST_CLAIM in names:
        _disable_lost_claim_resolution()
    if TAKEOVER_RESUME in names:
        _disable_takeover_resume()
    if RELEASING_ENTRY in names:
        _disable_releasing_entry()
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
    if not hasattr(connection_expressions, "COND_CHECKPOINT"):
        raise RuntimeError("unsafe: lease.connection_expressions.COND_CHECKPOINT is gone; update unsafe.py")
    # Read at call time by ConnectionStore.checkpoint.
    connection_expressions.COND_CHECKPOINT = COND_CHECKPOINT_UNFENCED


def _disable_lost_claim_resolution() -> None:
    # Imported here: the worker's modules import this one's caller, not the other way round.
    from leaseworker.worker.acquirer import Acquirer
    from leaseworker.worker.audit import Audit

    for owner, name in ((Acquirer, "_resolve"), (Audit, "round")):
        if not callable(owner.__dict__.get(name)):
            raise RuntimeError(f"unsafe: {owner.__name__}.{name} is gone; update unsafe.py")

    async def drop_unresolved(self: Acquirer, uncertain: object) -> None:
        return None  # as if the lost claim had never been applied

    async def no_audit(self: Audit) -> int:
        return 0

    setattr(Acquirer, "_resolve", drop_unresolved)  # noqa: B010
    setattr(Audit, "round", no_audit)  # noqa: B010


def _disable_takeover_resume() -> None:
    from leaseworker.lease.model import NO_CHECKPOINT
    from leaseworker.worker import peers

    if not callable(getattr(peers, "resume_seq", None)):
        raise RuntimeError("unsafe: worker.peers.resume_seq is gone; update unsafe.py")

    def ignore_dead_holders_entry(entries: object, connection_id: str, epoch: int) -> int:
        return NO_CHECKPOINT

    setattr(peers, "resume_seq", ignore_dead_holders_entry)  # noqa: B010


def _disable_releasing_entry() -> None:
    from leaseworker.lease.model import LeaseState
    from leaseworker.worker.checkpointer import Checkpointer
    from leaseworker.worker.registry import Registry

    original = Checkpointer.__dict__.get("round")
    if not callable(original) or not callable(Registry.__dict__.get("live")):
        raise RuntimeError("unsafe: Checkpointer.round or Registry.live is gone; update unsafe.py")

    class WithoutReleasing:
        def __init__(self, registry: Registry) -> None:
            self._registry = registry

        def __getattr__(self, name: str) -> object:
            return getattr(self._registry, name)

        def live(self) -> list[object]:
            return [o for o in self._registry.live() if o.lease.state is not LeaseState.RELEASING]

    async def round_without_releasing(self: Checkpointer) -> None:
        registry = self._registry
        self._registry = WithoutReleasing(registry)  # type: ignore[assignment]
        try:
            await original(self)
        finally:
            self._registry = registry

    setattr(Checkpointer, "round", round_without_releasing)  # noqa: B010
