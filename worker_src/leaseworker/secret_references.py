"""What a template reference may say, and how a resolved value is kept out of text (docs/design.md
§4.2 "Secrets").

A `generic/1` config may name `{{env:NAME}}` and `{{secret:NAME#KEY}}`. `parse_reference` checks
one (without braces) by the rules the stack's `upstreamSecrets` also applies (stacks/config.py:
synth accepts no name the worker would refuse):

- `env:NAME`: NAME is a variable name, `[A-Za-z_][A-Za-z0-9_]*`;
- `secret:NAME#KEY`: NAME is a Secrets Manager name (1-512 of `A-Za-z0-9/_+=.@-`) or a full
  secret ARN; `#KEY` selects a member of its JSON SecretString, and `secret:NAME` alone is the
  whole string. A secret name never contains `#`, so the first `#` ends the name.

The errors are one line naming the reference, never a value: `UnresolvedReference` (a
ValueError: as configured it cannot work) and `SecretsUnavailable` (Secrets Manager could not
answer for now). `redact` scrubs resolved values, raw and URL-encoded, from text an upstream may
have echoed. Nothing here logs.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

ENV_PREFIX = "env:"
SECRET_PREFIX = "secret:"
# Secrets Manager's rules: a name is 1-512 of ASCII letters, digits and /_+=.@- ; a full ARN ends
# in the name, a hyphen and six random characters that Secrets Manager appends.
SECRET_NAME_PATTERN = re.compile(r"[A-Za-z0-9/_+=.@-]{1,512}")
SECRET_ARN_PATTERN = re.compile(
    r"arn:aws[-a-z]*:secretsmanager:[a-z]{2}(-[a-z]+)+-[0-9]:[0-9]{12}:secret:[A-Za-z0-9/_+=.@-]{1,512}"
    r"-[A-Za-z0-9]{6}"
)
ENV_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Shorter values are not redacted: "***" in place of every "true" would make errors unreadable,
# and a credential that short protects nothing.
MIN_REDACTED_LENGTH = 4
REDACTED = "***"
# A reference is echoed in error messages: keep it to one short line whatever the config holds.
MAX_SHOWN_REFERENCE = 200


class UnresolvedReference(ValueError):
    """A reference that cannot be resolved as configured; str() is one line, never a value."""

    def __init__(self, reference: str, reason: str) -> None:
        super().__init__(f"unresolved reference {_shown(reference)}: {reason}")
        self.reference = reference
        self.reason = reason


class SecretsUnavailable(Exception):
    """Secrets Manager could not answer for now (throttled, timed out, unreachable): retryable."""

    def __init__(self, reference: str, reason: str) -> None:
        super().__init__(f"secret unavailable for {_shown(reference)}: {reason}")
        self.reference = reference
        self.reason = reason


def _shown(reference: str) -> str:
    """The reference as one printable line (it comes from a config, not from a secret)."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in reference)
    if len(text) > MAX_SHOWN_REFERENCE:
        return text[: MAX_SHOWN_REFERENCE - 3] + "..."
    return text


@dataclass(frozen=True, slots=True)
class Reference:
    """A parsed reference: `env:NAME`, `secret:NAME` or `secret:NAME#KEY` (`text` as written)."""

    text: str
    kind: Literal["env", "secret"]
    name: str
    key: str | None = None


def parse_reference(text: str) -> Reference:
    """Parse one reference; a malformed one raises `UnresolvedReference` naming the rule."""
    if text.startswith(ENV_PREFIX):
        name = text.removeprefix(ENV_PREFIX)
        if not ENV_NAME_PATTERN.fullmatch(name):
            raise UnresolvedReference(
                text, "malformed: env:NAME needs a variable name ([A-Za-z_][A-Za-z0-9_]*)"
            )
        return Reference(text, "env", name)
    if text.startswith(SECRET_PREFIX):
        secret_id, hash_sign, key = text.removeprefix(SECRET_PREFIX).partition("#")
        if not (SECRET_NAME_PATTERN.fullmatch(secret_id) or SECRET_ARN_PATTERN.fullmatch(secret_id)):
            raise UnresolvedReference(
                text,
                "malformed: secret:NAME#KEY needs a secret name (1-512 of A-Za-z0-9/_+=.@-) or a secret ARN",
            )
        if hash_sign and not key:
            raise UnresolvedReference(text, "malformed: empty KEY after '#' (omit '#' for the whole secret)")
        return Reference(text, "secret", secret_id, key if hash_sign else None)
    raise UnresolvedReference(text, "malformed: a reference is env:NAME or secret:NAME#KEY")


def redact(text: str, values: Iterable[str]) -> str:
    """`text` with every occurrence of each value (of length >= 4) replaced by "***".

    Also scrubs each value's URL-encoded forms, since an upstream may echo a token from a query
    string. Longer values are replaced first, so a value that contains another goes whole.
    """
    forms: set[str] = set()
    for value in values:
        if len(value) < MIN_REDACTED_LENGTH:
            continue
        forms.update((value, urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value)))
    if not forms:
        return text
    pattern = "|".join(re.escape(form) for form in sorted(forms, key=lambda f: (-len(f), f)))
    return re.sub(pattern, REDACTED, text)
