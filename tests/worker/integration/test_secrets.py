"""Template references (`env:NAME`, `secret:NAME#KEY`) against moto's Secrets Manager server.

Real calls to a real (local) server, not mocks: a counting wrapper around the aioboto3 client
shows what the cache saves. Access denial comes from a second moto server with IAM
authorisation on; a timeout from a TCP server that never answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aioboto3
import pytest
from botocore.exceptions import ClientError

from leaseworker import secret_references
from leaseworker import secrets as secrets_module
from leaseworker.secret_references import SecretsUnavailable, UnresolvedReference, parse_reference, redact
from leaseworker.secrets import SECRETS_CLIENT_CONFIG, ReferenceResolver, secrets_client
from leaseworker.settings import Settings
from leaseworker_dev.local.services import ManagedProcess, start_moto_server

if TYPE_CHECKING:
    from types_aiobotocore_secretsmanager import SecretsManagerClient

REGION = "us-east-1"
TOKEN = "tok-5f3a9c1e-very-secret"
PASSWORD = "p@ss/word+with=specials"
DOCUMENT = {"token": TOKEN, "password": PASSWORD, "port": 8443, "tls": True, "nested": {"a": 1}}


class CountingClient:
    """The real client, with every GetSecretValue recorded."""

    def __init__(self, client: SecretsManagerClient) -> None:
        self.client = client
        self.calls: list[str] = []

    async def get_secret_value(self, *, SecretId: str) -> Mapping[str, object]:
        self.calls.append(SecretId)
        return await self.client.get_secret_value(SecretId=SecretId)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def sm(moto_endpoint: str) -> AsyncIterator[SecretsManagerClient]:
    async with aioboto3.Session().client(
        "secretsmanager", endpoint_url=moto_endpoint, region_name=REGION, config=SECRETS_CLIENT_CONFIG
    ) as client:
        yield client


@pytest.fixture
def counting(sm: SecretsManagerClient) -> CountingClient:
    return CountingClient(sm)


async def create(sm: SecretsManagerClient, value: str) -> tuple[str, str]:
    """A fresh secret (unique name per test): (name, ARN)."""
    name = f"leaseworker/test-{uuid.uuid4().hex[:10]}"
    created = await sm.create_secret(Name=name, SecretString=value)
    return name, created["ARN"]


def assert_clean(error: BaseException, *values: str) -> None:
    """One line, and no secret value in the message, the args or any chained exception."""
    text = str(error)
    assert "\n" not in text
    chain: BaseException | None = error
    while chain is not None:
        for value in values:
            assert value not in str(chain)
            assert value not in repr(chain.args)
        chain = chain.__cause__ or chain.__context__


# --- Resolving --------------------------------------------------------------------------------


async def test_resolves_env_keys_whole_secret_and_arn(
    counting: CountingClient, sm: SecretsManagerClient
) -> None:
    name, arn = await create(sm, json.dumps(DOCUMENT))
    whole_name, _ = await create(sm, "plain-text-token-value")
    resolver = ReferenceResolver(counting, environ={"FEED_USER": "alice"})
    refs = [
        "env:FEED_USER",
        f"secret:{name}#token",
        f"secret:{name}#password",
        f"secret:{name}#port",
        f"secret:{name}#tls",
        f"secret:{arn}#token",
        f"secret:{whole_name}",
    ]
    assert await resolver.resolve(refs) == {
        "env:FEED_USER": "alice",
        f"secret:{name}#token": TOKEN,
        f"secret:{name}#password": PASSWORD,
        f"secret:{name}#port": "8443",
        f"secret:{name}#tls": "true",
        f"secret:{arn}#token": TOKEN,
        f"secret:{whole_name}": "plain-text-token-value",
    }
    # One call per secret id, however many keys: the name, the ARN and the plain secret.
    assert sorted(counting.calls) == sorted([name, arn, whole_name])


async def test_real_client_satisfies_the_reader_protocol(sm: SecretsManagerClient) -> None:
    name, _ = await create(sm, json.dumps(DOCUMENT))
    assert await ReferenceResolver(sm).resolve([f"secret:{name}#token"]) == {f"secret:{name}#token": TOKEN}


async def test_environ_defaults_to_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEASEWORKER_TEST_REF", "from-os-environ")
    resolved = await ReferenceResolver(None).resolve(["env:LEASEWORKER_TEST_REF"])
    assert resolved == {"env:LEASEWORKER_TEST_REF": "from-os-environ"}


async def test_second_resolve_is_served_from_the_cache(
    counting: CountingClient, sm: SecretsManagerClient
) -> None:
    name, _ = await create(sm, json.dumps(DOCUMENT))
    resolver = ReferenceResolver(counting)
    ref = f"secret:{name}#token"
    assert await resolver.resolve([ref]) == {ref: TOKEN}
    assert await resolver.resolve([ref, f"secret:{name}#password"]) == {
        ref: TOKEN,
        f"secret:{name}#password": PASSWORD,
    }
    assert counting.calls == [name]


async def test_cache_expires_after_the_ttl(counting: CountingClient, sm: SecretsManagerClient) -> None:
    name, _ = await create(sm, json.dumps(DOCUMENT))
    clock = FakeClock()
    resolver = ReferenceResolver(counting, ttl_seconds=300, now=clock)
    ref = f"secret:{name}#token"
    await resolver.resolve([ref])
    clock.now += 299.9
    await resolver.resolve([ref])
    assert counting.calls == [name]
    clock.now += 0.1
    await resolver.resolve([ref])
    assert counting.calls == [name, name]


async def test_concurrent_resolves_share_one_call(counting: CountingClient, sm: SecretsManagerClient) -> None:
    name, _ = await create(sm, json.dumps(DOCUMENT))
    resolver = ReferenceResolver(counting)
    ref = f"secret:{name}#token"
    results = await asyncio.gather(*(resolver.resolve([ref]) for _ in range(8)))
    assert results == [{ref: TOKEN}] * 8
    assert counting.calls == [name]


async def test_invalidate_rereads_and_picks_up_a_rotation(
    counting: CountingClient, sm: SecretsManagerClient
) -> None:
    name, _ = await create(sm, json.dumps(DOCUMENT))
    resolver = ReferenceResolver(counting)
    ref = f"secret:{name}#token"
    assert await resolver.resolve([ref]) == {ref: TOKEN}
    # Rotation: a new version becomes AWSCURRENT.
    rotated = "tok-rotated-0b7d44e2"
    await sm.put_secret_value(SecretId=name, SecretString=json.dumps({**DOCUMENT, "token": rotated}))
    assert await resolver.resolve([ref]) == {ref: TOKEN}  # still cached: no call
    assert counting.calls == [name]
    # The upstream refused the old token: invalidate, and the next resolve reads the new one.
    resolver.invalidate([ref, "env:IGNORED", "not a reference"])
    assert await resolver.resolve([ref]) == {ref: rotated}
    assert counting.calls == [name, name]
    assert await resolver.resolve([ref]) == {ref: rotated}
    assert counting.calls == [name, name]


async def test_invalidate_drops_only_the_named_secrets(
    counting: CountingClient, sm: SecretsManagerClient
) -> None:
    first, _ = await create(sm, json.dumps(DOCUMENT))
    second, _ = await create(sm, json.dumps(DOCUMENT))
    resolver = ReferenceResolver(counting)
    refs = [f"secret:{first}#token", f"secret:{second}#token"]
    await resolver.resolve(refs)
    resolver.invalidate([f"secret:{first}#password"])  # any key of the secret drops the secret
    await resolver.resolve(refs)
    assert counting.calls == [first, second, first]


async def test_failures_are_not_cached(counting: CountingClient, sm: SecretsManagerClient) -> None:
    name = f"leaseworker/test-{uuid.uuid4().hex[:10]}"
    resolver = ReferenceResolver(counting)
    with pytest.raises(UnresolvedReference, match="secret not found"):
        await resolver.resolve([f"secret:{name}#token"])
    await sm.create_secret(Name=name, SecretString=json.dumps(DOCUMENT))
    assert await resolver.resolve([f"secret:{name}#token"]) == {f"secret:{name}#token": TOKEN}
    assert counting.calls == [name, name]


# --- Errors: one line naming the reference and why, never a value ---------------------------


async def test_each_error_is_one_line_naming_the_reference_and_why(
    counting: CountingClient, sm: SecretsManagerClient
) -> None:
    name, _ = await create(sm, json.dumps(DOCUMENT))
    not_json, _ = await create(sm, f"token={TOKEN}")
    array, _ = await create(sm, json.dumps([TOKEN]))
    binary = f"leaseworker/test-{uuid.uuid4().hex[:10]}"
    await sm.create_secret(Name=binary, SecretBinary=TOKEN.encode())
    missing = f"leaseworker/test-{uuid.uuid4().hex[:10]}"
    resolver = ReferenceResolver(counting, environ={"SET": "x"})
    cases = {
        f"secret:{missing}#token": f"unresolved reference secret:{missing}#token: secret not found",
        f"secret:{not_json}#token": (
            f"unresolved reference secret:{not_json}#token: "
            "the SecretString is not JSON (a #KEY needs a JSON object)"
        ),
        f"secret:{array}#token": (
            f"unresolved reference secret:{array}#token: "
            "the SecretString is JSON but not an object (a #KEY needs one)"
        ),
        f"secret:{name}#nope": (
            f"unresolved reference secret:{name}#nope: no such key in the secret's JSON object"
        ),
        f"secret:{name}#nested": (
            f"unresolved reference secret:{name}#nested: the key's value is an object, not a string or number"
        ),
        f"secret:{binary}": (
            f"unresolved reference secret:{binary}: the secret has no SecretString (a binary secret)"
        ),
        "env:UNSET_VARIABLE": "unresolved reference env:UNSET_VARIABLE: environment variable is not set",
    }
    for ref, message in cases.items():
        with pytest.raises(UnresolvedReference) as raised:
            await resolver.resolve(["env:SET", ref])
        assert str(raised.value) == message
        assert raised.value.reference == ref
        assert_clean(raised.value, TOKEN, PASSWORD)


@pytest.mark.parametrize(
    ("ref", "reason"),
    [
        ("token", "malformed: a reference is env:NAME or secret:NAME#KEY"),
        ("env:", "malformed: env:NAME needs a variable name ([A-Za-z_][A-Za-z0-9_]*)"),
        ("env:1ABC", "malformed: env:NAME needs a variable name ([A-Za-z_][A-Za-z0-9_]*)"),
        (
            "secret:",
            "malformed: secret:NAME#KEY needs a secret name (1-512 of A-Za-z0-9/_+=.@-) or a secret ARN",
        ),
        (
            "secret:bad name#k",
            "malformed: secret:NAME#KEY needs a secret name (1-512 of A-Za-z0-9/_+=.@-) or a secret ARN",
        ),
        ("secret:name#", "malformed: empty KEY after '#' (omit '#' for the whole secret)"),
    ],
)
def test_malformed_references(ref: str, reason: str) -> None:
    with pytest.raises(UnresolvedReference) as raised:
        parse_reference(ref)
    assert str(raised.value) == f"unresolved reference {ref}: {reason}"


def test_parse_reference_forms() -> None:
    arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:feeds/alpaca-AbC123"
    assert parse_reference("env:HOME").name == "HOME"
    assert parse_reference(f"secret:{arn}#key#with#hashes") == secret_references.Reference(
        f"secret:{arn}#key#with#hashes", "secret", arn, "key#with#hashes"
    )
    assert parse_reference("secret:a/b_c+d=e.f@g-h").key is None


def test_a_hostile_reference_is_shown_on_one_line() -> None:
    with pytest.raises(UnresolvedReference) as raised:
        parse_reference("env:A\nB" + "x" * 500)
    assert "\n" not in str(raised.value)
    assert len(str(raised.value)) < 400


async def test_missing_client_refuses_secret_references() -> None:
    with pytest.raises(UnresolvedReference, match="no Secrets Manager client is configured"):
        await ReferenceResolver(None).resolve(["secret:anything#k"])


@pytest.fixture
def auth_moto(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[ManagedProcess]:
    """A moto server that enforces IAM after the first two calls (creating a user and its key)."""
    monkeypatch.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "2")
    process = start_moto_server(log_path=tmp_path / "moto-auth.log")
    monkeypatch.delenv("INITIAL_NO_AUTH_ACTION_COUNT")
    try:
        yield process
    finally:
        process.stop()


async def test_access_denied_names_the_grant(auth_moto: ManagedProcess) -> None:
    session = aioboto3.Session()
    async with session.client("iam", endpoint_url=auth_moto.url, region_name=REGION) as iam:
        await iam.create_user(UserName="worker-without-grant")
        key = (await iam.create_access_key(UserName="worker-without-grant"))["AccessKey"]
    async with session.client(
        "secretsmanager",
        endpoint_url=auth_moto.url,
        region_name=REGION,
        aws_access_key_id=key["AccessKeyId"],
        aws_secret_access_key=key["SecretAccessKey"],
        config=SECRETS_CLIENT_CONFIG,
    ) as client:
        with pytest.raises(UnresolvedReference) as raised:
            await ReferenceResolver(client).resolve(["secret:feeds/alpaca#key"])
    assert str(raised.value) == (
        "unresolved reference secret:feeds/alpaca#key: access denied "
        "(the task role reads only the secrets that context upstreamSecrets names)"
    )


async def test_a_hung_endpoint_is_unavailable_within_the_call_deadline() -> None:
    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client gives up and closes
        writer.close()

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with aioboto3.Session().client(
            "secretsmanager",
            endpoint_url=f"http://127.0.0.1:{port}",
            region_name=REGION,
            config=SECRETS_CLIENT_CONFIG,
        ) as client:
            resolver = ReferenceResolver(client, call_timeout_seconds=0.5)
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(SecretsUnavailable) as raised:
                await resolver.resolve(["secret:feeds/alpaca#key"])
            assert loop.time() - started < 2.0
    finally:
        server.close()
    assert str(raised.value) == (
        "secret unavailable for secret:feeds/alpaca#key: GetSecretValue timed out after 0.5 s"
    )


def client_error(code: str, status: int = 400) -> ClientError:
    response: Any = {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(response, "GetSecretValue")


@pytest.mark.parametrize(
    ("code", "status", "kind", "reason"),
    [
        ("DecryptionFailure", 400, UnresolvedReference, "cannot be decrypted: grant kms:Decrypt"),
        ("AccessDeniedException", 400, UnresolvedReference, "access denied"),
        ("InvalidRequestException", 400, UnresolvedReference, "scheduled for deletion or disabled"),
        ("403", 403, UnresolvedReference, "access denied"),
        ("ThrottlingException", 400, SecretsUnavailable, "Secrets Manager error ThrottlingException"),
        ("InternalServiceError", 500, SecretsUnavailable, "Secrets Manager error InternalServiceError"),
    ],
)
def test_error_codes_moto_cannot_produce_are_classified(
    code: str, status: int, kind: type[Exception], reason: str
) -> None:
    """KMS failures and throttles have no moto equivalent: the classification table, by code."""
    ref = parse_reference("secret:feeds/alpaca#key")
    error = secrets_module._client_error(ref, client_error(code, status))
    assert type(error) is kind
    assert reason in str(error)


# --- No value is ever logged --------------------------------------------------------------------


@pytest.mark.parametrize("module", [secrets_module, secret_references])
def test_the_module_has_no_logging(module: Any) -> None:
    source = Path(str(module.__file__)).read_text()
    assert "import logging" not in source
    assert "getLogger" not in source
    assert "print(" not in source


async def test_resolving_logs_nothing_of_ours(
    caplog: pytest.LogCaptureFixture, counting: CountingClient, sm: SecretsManagerClient
) -> None:
    name, _ = await create(sm, json.dumps(DOCUMENT))
    with caplog.at_level(logging.DEBUG, logger="leaseworker"):
        resolver = ReferenceResolver(counting)
        await resolver.resolve([f"secret:{name}#token"])
        with pytest.raises(UnresolvedReference):
            await resolver.resolve([f"secret:{name}#nested"])
    assert [r for r in caplog.records if r.name.startswith("leaseworker")] == []
    assert TOKEN not in caplog.text


# --- redact -----------------------------------------------------------------------------------


def test_redact_replaces_every_occurrence() -> None:
    text = f"401 from wss://feed.example/ws?token={TOKEN}: bad token {TOKEN}"
    assert redact(text, [TOKEN]) == "401 from wss://feed.example/ws?token=***: bad token ***"


def test_redact_url_encoded_forms_and_longest_first() -> None:
    text = "auth p%40ss%2Fword%2Bwith%3Dspecials and p@ss/word+with=specials and abcdefgh"
    assert redact(text, [PASSWORD, "abcd", "abcdefgh"]) == "auth *** and *** and ***"


def test_redact_ignores_short_values_and_empty_input() -> None:
    assert redact("the value abc is shown", ["abc", ""]) == "the value abc is shown"
    assert redact("nothing to do", []) == "nothing to do"
    assert redact("regex .* chars", [".* c"]) == "regex ***hars"


# --- The worker's client ----------------------------------------------------------------------


async def test_secrets_client_uses_the_endpoint_variable_and_bounded_retries(
    monkeypatch: pytest.MonkeyPatch, moto_endpoint: str, sm: SecretsManagerClient
) -> None:
    name, _ = await create(sm, json.dumps(DOCUMENT))
    monkeypatch.setenv("AWS_ENDPOINT_URL_SECRETS_MANAGER", moto_endpoint)
    settings = Settings(worker_id="secrets-test", region=REGION)
    async with AsyncExitStack() as stack:
        client = await secrets_client(stack, aioboto3.Session(), settings)
        retries = client.meta.config.retries  # type: ignore[attr-defined]
        assert retries == {"total_max_attempts": 2, "mode": "standard"}
        resolver = ReferenceResolver(client)
        assert await resolver.resolve([f"secret:{name}#token"]) == {f"secret:{name}#token": TOKEN}
