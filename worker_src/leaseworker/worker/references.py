"""What a session needs to render a protocol's templates: `env:NAME` and `secret:NAME#KEY` values.

The worker passes its ReferenceResolver (leaseworker/secrets.py: Secrets Manager, cached, read
again after an auth refusal); a session built without one resolves environment references only.
Resolved values are handed to the adapter for one socket and never logged.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from leaseworker.protocol.adapter import ConfigError


class References(Protocol):
    """Resolves `env:NAME` and `secret:NAME#KEY` references (leaseworker/secrets.py)."""

    async def resolve(self, refs: Any) -> dict[str, str]: ...

    def invalidate(self, refs: Any) -> None: ...


class NoReferences:
    """For a worker without a secrets client: environment references only."""

    async def resolve(self, refs: Any) -> dict[str, str]:
        values: dict[str, str] = {}
        for ref in refs:
            name = ref.removeprefix("env:")
            if not ref.startswith("env:") or name not in os.environ:
                raise ConfigError("references", f"{ref} cannot be resolved here")
            values[ref] = os.environ[name]
        return values

    def invalidate(self, refs: Any) -> None:
        return None
