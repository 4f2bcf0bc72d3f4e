"""The worker's one non-zero exit of its own making: its session was fenced (docs/design.md §2.0)."""

from __future__ import annotations

EXIT_FENCED = 3  # distinct from 1 (a failure) and 2 (bad input): the supervisor passes it on


class WorkerFenced(Exception):
    """A peer or the supervisor fenced our session: every lease was dropped at once."""

    def __init__(self, fenced_by: str | None, kind: str, reason: str) -> None:
        super().__init__(
            f"session fenced by {fenced_by or 'unknown'} ({kind}): {reason or 'no reason'}; "
            "exiting so that a fresh worker takes this one's place"
        )
        self.fenced_by = fenced_by
        self.kind = kind
        self.reason = reason
