"""Resolving template references to secrets and environment variables (docs/design.md §4.2
"Secrets"); what a reference may say, its errors and `redact` are in `secret_references`.

A `generic/1` config may name `{{env:NAME}}` and `{{secret:NAME#KEY}}`; the template engine
hands the references, without braces, to `ReferenceResolver.resolve` when a socket connects:

- `env:NAME`: the variable NAME of the worker's environment (an injected mapping).
- `secret:NAME#KEY`: AWS Secrets Manager `GetSecretValue` of the secret NAME (a name or an
  ARN); its SecretString is a JSON object and KEY selects a member. `secret:NAME` alone is the
  whole SecretString. A secret name never contains `#`, so the first `#` ends the name.

Each secret is read once per TTL (one call however many references and sessions name it), and
`invalidate` drops it so that the next resolve re-reads: the caller invalidates after an
upstream refuses its credentials, which is how a rotated secret is picked up at once.

Secret values never leave the dict `resolve` returns: nothing here logs, and no exception
message or chained exception carries a value. `redact` scrubs them from text that an upstream
may have echoed (a URL, a header) before that text reaches `last_error` or a log line.

Errors are one line that names the reference and why:
- `UnresolvedReference` (a ValueError): the reference cannot be resolved as configured: it is
  malformed, the variable is unset, the secret does not exist, access is denied, the value is
  not JSON or has no such key. Retrying will not help until someone changes something.
- `SecretsUnavailable`: Secrets Manager could not answer (throttled, timed out, unreachable,
  a service error). Transient: the session backs off and tries again.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Iterable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import aioboto3
from aiobotocore.config import AioConfig
from botocore.exceptions import BotoCoreError, ClientError

from leaseworker.clock import monotonic
from leaseworker.secret_references import Reference, SecretsUnavailable, UnresolvedReference, parse_reference
from leaseworker.settings import Settings

if TYPE_CHECKING:
    from types_aiobotocore_secretsmanager import SecretsManagerClient

__all__ = [
    "DEFAULT_CALL_TIMEOUT_SECONDS",
    "DEFAULT_TTL_SECONDS",
    "SECRETS_CLIENT_CONFIG",
    "ReferenceResolver",
    "SecretsReader",
    "secrets_client",
]

DEFAULT_TTL_SECONDS = 300.0
# One GetSecretValue, SDK retries included, never takes longer than this: a session waits for it
# before its socket connects, so a slow Secrets Manager delays one connect, not the worker.
DEFAULT_CALL_TIMEOUT_SECONDS = 5.0
# Bounded retries (two attempts in all) under the per-call deadline above.
SECRETS_CLIENT_CONFIG = AioConfig(
    connect_timeout=2,
    read_timeout=3,
    retries={"total_max_attempts": 2, "mode": "standard"},
)
_DENIED = "access denied (the task role reads only the secrets that context upstreamSecrets names)"
# Secrets Manager error codes -> why the reference cannot be resolved (permanent for this config).
_REFUSALS: Mapping[str, str] = {
    "ResourceNotFoundException": "secret not found",
    "AccessDeniedException": _DENIED,
    "AccessDenied": _DENIED,
    "DecryptionFailure": "cannot be decrypted: grant kms:Decrypt on the secret's KMS key",
    "InvalidRequestException": "refused by Secrets Manager (scheduled for deletion or disabled)",
    "InvalidParameterException": "refused by Secrets Manager (invalid secret id)",
}


class SecretsReader(Protocol):
    """What the resolver needs of a Secrets Manager client (aioboto3's, or a wrapper of it)."""

    async def get_secret_value(self, *, SecretId: str) -> Mapping[str, object]: ...


@dataclass(slots=True)
class _Cached:
    secret_string: str
    fetched_at: float


class ReferenceResolver:
    """Resolves references; caches each secret for `ttl_seconds`; `invalidate` forces a re-read.

    One resolver serves every session of a worker. Concurrent resolves of the same secret share
    one GetSecretValue call. Failures are not cached: the caller's backoff paces retries.
    """

    def __init__(
        self,
        client: SecretsReader | None,
        *,
        environ: Mapping[str, str] | None = None,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        call_timeout_seconds: float = DEFAULT_CALL_TIMEOUT_SECONDS,
        now: Callable[[], float] = monotonic,
    ) -> None:
        """`client` may be None when no secret is configured; a secret reference then fails."""
        self._client = client
        self._environ: Mapping[str, str] = os.environ if environ is None else environ
        self._ttl = ttl_seconds
        self._call_timeout = call_timeout_seconds
        self._now = now
        self._cache: dict[str, _Cached] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def resolve(self, refs: Iterable[str]) -> dict[str, str]:
        """{reference: value} for every reference; the first that fails raises (in order given)."""
        parsed = [parse_reference(ref) for ref in refs]
        values: dict[str, str] = {}
        for ref in parsed:
            if ref.text in values:
                continue
            if ref.kind == "env":
                value = self._environ.get(ref.name)
                if value is None:
                    raise UnresolvedReference(ref.text, "environment variable is not set")
                values[ref.text] = value
            else:
                secret_string = await self._secret_string(ref)
                values[ref.text] = _select(ref, secret_string)
        return values

    def invalidate(self, refs: Iterable[str]) -> None:
        """Forget the secrets these references name: the next resolve reads them again.

        Call it after an upstream refused the credentials (the secret may have rotated).
        Environment references and malformed ones have nothing cached and are ignored.
        """
        for text in refs:
            try:
                ref = parse_reference(text)
            except UnresolvedReference:
                continue
            if ref.kind == "secret":
                self._cache.pop(ref.name, None)

    def _fresh(self, secret_id: str) -> str | None:
        cached = self._cache.get(secret_id)
        if cached is not None and self._now() - cached.fetched_at < self._ttl:
            return cached.secret_string
        return None

    async def _secret_string(self, ref: Reference) -> str:
        secret_id = ref.name
        fresh = self._fresh(secret_id)
        if fresh is not None:
            return fresh
        lock = self._locks.setdefault(secret_id, asyncio.Lock())
        async with lock:
            fresh = self._fresh(secret_id)  # another session may have read it while we waited
            if fresh is not None:
                return fresh
            secret_string = await self._fetch(ref)
            self._cache[secret_id] = _Cached(secret_string, self._now())
            return secret_string

    async def _fetch(self, ref: Reference) -> str:
        if self._client is None:
            raise UnresolvedReference(ref.text, "no Secrets Manager client is configured")
        try:
            async with asyncio.timeout(self._call_timeout):
                response = await self._client.get_secret_value(SecretId=ref.name)
        except TimeoutError:
            raise SecretsUnavailable(
                ref.text, f"GetSecretValue timed out after {self._call_timeout:g} s"
            ) from None
        except ClientError as error:
            raise _client_error(ref, error) from error
        except BotoCoreError as error:
            raise SecretsUnavailable(
                ref.text, f"Secrets Manager unreachable ({type(error).__name__})"
            ) from None
        secret_string = response.get("SecretString")
        if not isinstance(secret_string, str):
            raise UnresolvedReference(ref.text, "the secret has no SecretString (a binary secret)")
        return secret_string


def _client_error(ref: Reference, error: ClientError) -> UnresolvedReference | SecretsUnavailable:
    """Classify a Secrets Manager error by its code, never by its message."""
    code = str(error.response.get("Error", {}).get("Code", ""))
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in _REFUSALS:
        return UnresolvedReference(ref.text, _REFUSALS[code])
    if status == 403:  # an endpoint that answers a denial without a JSON error body
        return UnresolvedReference(ref.text, _DENIED)
    return SecretsUnavailable(ref.text, f"Secrets Manager error {code or status}")


_MEMBER_KINDS: Mapping[type, str] = {dict: "an object", list: "an array", type(None): "null"}


def _select(ref: Reference, secret_string: str) -> str:
    """The whole SecretString, or the member KEY of its JSON object (scalars only)."""
    if ref.key is None:
        return secret_string
    try:
        document = json.loads(secret_string)
    except ValueError:
        # `from None`: a JSONDecodeError carries the whole document (`.doc`), i.e. the secret.
        raise UnresolvedReference(
            ref.text, "the SecretString is not JSON (a #KEY needs a JSON object)"
        ) from None
    if not isinstance(document, dict):
        raise UnresolvedReference(ref.text, "the SecretString is JSON but not an object (a #KEY needs one)")
    if ref.key not in document:
        raise UnresolvedReference(ref.text, "no such key in the secret's JSON object")
    member = document[ref.key]
    if isinstance(member, str):
        return member
    if isinstance(member, bool | int | float):
        return json.dumps(member)
    kind = _MEMBER_KINDS.get(type(member), "not a scalar")
    raise UnresolvedReference(ref.text, f"the key's value is {kind}, not a string or number")


async def secrets_client(
    stack: AsyncExitStack, session: aioboto3.Session, settings: Settings
) -> SecretsManagerClient:
    """The worker's Secrets Manager client, open until `stack` closes (like `aws.sqs_client`).

    No endpoint here: botocore resolves AWS_ENDPOINT_URL_SECRETS_MANAGER / AWS_ENDPOINT_URL itself
    (locally, moto), and ECS sets AWS_REGION.
    """
    client: SecretsManagerClient = await stack.enter_async_context(
        session.client("secretsmanager", region_name=settings.region, config=SECRETS_CLIENT_CONFIG)
    )
    return client
