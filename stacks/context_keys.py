"""Refuse a context key that looks like one of ours but is not (a typo would be silently ignored).

CDK and its CLI put their own keys in the same context: `aws:cdk:*`, `@aws-cdk/*` feature
flags, `cli-telemetry`, `availability-zones:account=…:region=…` lookups,
`acknowledged-issue-numbers`. Ours are plain identifiers (`leaseSeconds`): only a key of that
shape, or one that differs from a known key only by case, `-` or `_`, is ours to refuse.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

from stacks.context_values import ConfigError

# Our namespace: letters, digits and `_`, starting with a letter. Every CDK/CLI key has a
# `:`, `/`, `@` or `-` in it.
OWN_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def _folded(key: str) -> str:
    return key.replace("-", "").replace("_", "").lower()


def nearest_key(key: str, known: Iterable[str]) -> str | None:
    """The known key a typo most likely meant: same letters ignoring case, `-`, `_`; else closest."""
    candidates = sorted(known)
    for candidate in candidates:
        if _folded(candidate) == _folded(key):
            return candidate
    folded = {_folded(c): c for c in candidates}
    close = difflib.get_close_matches(_folded(key), list(folded), n=1, cutoff=0.6)
    return folded[close[0]] if close else None


def check_context_keys(keys: Iterable[str], known: Iterable[str], values: dict[str, object]) -> None:
    """Raise ConfigError for the first (sorted) key in our namespace that is not a known one."""
    known_keys = set(known)
    folded_known = {_folded(k) for k in known_keys}
    for key in sorted(keys):
        if key in known_keys:
            continue
        if not (OWN_KEY.fullmatch(key) or _folded(key) in folded_known):
            continue  # CDK's or the CLI's
        nearest = nearest_key(key, known_keys)
        hint = f"did you mean `{nearest}`?" if nearest else "not a leaseworker parameter"
        raise ConfigError(
            key,
            values.get(key),
            f"unknown context key, {hint} (every parameter: docs/infrastructure.md#context-parameters)",
        )
