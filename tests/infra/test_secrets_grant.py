"""Context `upstreamSecrets`: its accepted forms, its one-line refusals, and the task role's grant
(exactly secretsmanager:GetSecretValue on exactly the named secrets; nothing without them)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_cdk.assertions import Annotations, Capture, Match

from stacks.config import ConfigError, LeaseworkerConfig, load_config
from tests.infra.conftest import Synth, synth
from tests.infra.test_checks import run_cfn_lint
from tests.infra.test_iam import role_statements

ARN = "arn:aws:secretsmanager:us-east-1:210987654321:secret:feeds/alpaca-AbC123"
SECRETS = f"app/token, feeds/home_assistant+prod@eu=1.x ,{ARN}"
EXPECTED_RESOURCES = [
    "arn:aws:secretsmanager:us-east-1:123456789012:secret:app/token-??????",
    "arn:aws:secretsmanager:us-east-1:123456789012:secret:feeds/home_assistant+prod@eu=1.x-??????",
    ARN,
]


def parse(**context: Any) -> LeaseworkerConfig:
    return load_config(context.get)


@pytest.fixture(scope="module")
def with_secrets() -> Synth:
    return synth({"upstreamSecrets": SECRETS})


# --- Parsing ------------------------------------------------------------------------------------


def test_default_is_no_secrets() -> None:
    assert parse().upstream_secrets == ()
    assert parse(upstreamSecrets=[]).upstream_secrets == ()
    assert parse(upstreamSecrets="").upstream_secrets == ()
    assert parse(upstreamSecrets="[]").upstream_secrets == ()


def test_list_json_string_and_comma_forms_agree() -> None:
    expected = ("app/token", ARN)
    assert parse(upstreamSecrets=["app/token", ARN]).upstream_secrets == expected  # cdk.json
    assert parse(upstreamSecrets=json.dumps(["app/token", ARN])).upstream_secrets == expected
    assert parse(upstreamSecrets=f"app/token,{ARN}").upstream_secrets == expected
    assert parse(upstreamSecrets=f" app/token , {ARN} ").upstream_secrets == expected
    assert parse(upstreamSecrets=f"app/token,{ARN},app/token").upstream_secrets == expected  # deduplicated
    assert parse(upstreamSecrets="x" * 512).upstream_secrets == ("x" * 512,)
    # Other partitions' ARNs, in a matching region.
    gov = "arn:aws-us-gov:secretsmanager:us-gov-west-1:123456789012:secret:a-AbC123"
    assert parse(region="us-gov-west-1", upstreamSecrets=gov).upstream_secrets == (gov,)


ITEM_RULE = (
    "must be a Secrets Manager secret name (1..512 of A-Za-z0-9/_+=.@-) "
    "or a secret ARN (arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME-XXXXXX)"
)
LIST_RULE = "must be a JSON list or a comma-separated string of secret names or ARNs"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("a,bad name", f"invalid context upstreamSecrets='a,bad name': item 'bad name' {ITEM_RULE}"),
        ("a,,b", f"invalid context upstreamSecrets='a,,b': item '' {ITEM_RULE}"),
        ("a,", f"invalid context upstreamSecrets='a,': item '' {ITEM_RULE}"),
        ("a#key", f"invalid context upstreamSecrets='a#key': item 'a#key' {ITEM_RULE}"),
        ("x" * 513, f"invalid context upstreamSecrets='{'x' * 513}': item '{'x' * 513}' {ITEM_RULE}"),
        (
            # An ARN without the six-character suffix is a partial ARN: refused, name it instead.
            "arn:aws:secretsmanager:us-east-1:123456789012:secret:feeds/alpaca",
            "invalid context upstreamSecrets='arn:aws:secretsmanager:us-east-1:123456789012:secret:"
            "feeds/alpaca': item 'arn:aws:secretsmanager:us-east-1:123456789012:secret:feeds/alpaca' "
            f"{ITEM_RULE}",
        ),
        (
            "arn:aws:ssm:us-east-1:123456789012:parameter/x-AbC123",
            "invalid context upstreamSecrets='arn:aws:ssm:us-east-1:123456789012:parameter/x-AbC123': "
            f"item 'arn:aws:ssm:us-east-1:123456789012:parameter/x-AbC123' {ITEM_RULE}",
        ),
        ('["a", 1]', f"invalid context upstreamSecrets='[\"a\", 1]': {LIST_RULE}"),
        ('["a"', f"invalid context upstreamSecrets='[\"a\"': {LIST_RULE}"),
        (42, f"invalid context upstreamSecrets=42: {LIST_RULE}"),
        ({"a": "b"}, f"invalid context upstreamSecrets={{'a': 'b'}}: {LIST_RULE}"),
        (
            "arn:aws:secretsmanager:eu-west-1:123456789012:secret:a-AbC123",
            "invalid context upstreamSecrets="
            "'arn:aws:secretsmanager:eu-west-1:123456789012:secret:a-AbC123': "
            "is in region eu-west-1, but the workers read secrets from their own region (us-east-1): "
            "replicate the secret to us-east-1 and name that replica",
        ),
    ],
)
def test_bad_values_are_refused_in_one_line(raw: object, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse(upstreamSecrets=raw)
    assert str(raised.value) == message
    assert "\n" not in str(raised.value)
    assert raised.value.name == "upstreamSecrets"


def test_what_synth_accepts_the_worker_resolves() -> None:
    """The stack and the worker apply the same naming rules (docs/design.md §7: synth ⊆ worker)."""
    from leaseworker.secret_references import parse_reference

    for secret in parse(upstreamSecrets=SECRETS).upstream_secrets:
        assert parse_reference(f"secret:{secret}#key").name == secret


# --- The grant --------------------------------------------------------------------------------


def secret_statements(s: Synth) -> list[dict[str, Any]]:
    return [st for st in role_statements(s, "TaskRoleArn") if "secretsmanager" in json.dumps(st)]


def test_no_secrets_no_secretsmanager_anywhere(default: Synth) -> None:
    assert default.config.upstream_secrets == ()
    assert secret_statements(default) == []
    assert "secretsmanager" not in json.dumps(default.template_json)


def test_exactly_get_secret_value_on_exactly_the_named_secrets(with_secrets: Synth) -> None:
    resources = Capture()
    with_secrets.template.has_resource_properties(
        "AWS::IAM::Policy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        {
                            "Sid": "UpstreamSecrets",
                            "Effect": "Allow",
                            "Action": "secretsmanager:GetSecretValue",
                            "Resource": resources,
                        }
                    ]
                )
            }
        },
    )
    assert resources.as_array() == EXPECTED_RESOURCES
    # That statement is the only one that mentions Secrets Manager, in the whole template.
    assert [st["Sid"] for st in secret_statements(with_secrets)] == ["UpstreamSecrets"]
    assert json.dumps(with_secrets.template_json).count('"secretsmanager:') == 1  # as an action
    # Nothing else about the task role changed.
    default = synth()
    others = [st for st in role_statements(with_secrets, "TaskRoleArn") if st.get("Sid") != "UpstreamSecrets"]
    assert others == role_statements(default, "TaskRoleArn")


def test_the_statement_is_on_the_task_role_not_the_execution_role(with_secrets: Synth) -> None:
    assert "secretsmanager" not in json.dumps(role_statements(with_secrets, "ExecutionRoleArn"))
    assert len(secret_statements(with_secrets)) == 1


def test_names_take_the_stack_account_and_region(custom: Synth) -> None:
    (statement,) = secret_statements(custom)
    assert statement["Resource"] == [
        "arn:aws:secretsmanager:eu-west-1:210987654321:secret:feeds/alpaca-??????",
        "arn:aws:secretsmanager:eu-west-1:210987654321:secret:feeds/binance-AbC123",
    ]


def test_nag_and_cfn_lint_stay_clean_without_a_new_acknowledgement(
    with_secrets: Synth, tmp_outdir: Any
) -> None:
    """cdk-nag's IAM5 flags `*` only; `-??????` (exactly six characters) needs no acknowledgement."""
    assert Annotations.from_stack(with_secrets.stack).find_error("*", Match.any_value()) == []
    report = with_secrets.outdir / "validation-report.json"
    if report.exists():
        for plugin in json.loads(report.read_text())["pluginReports"]:
            assert plugin["conclusion"] == "success", plugin
    result = run_cfn_lint(with_secrets.template_json, tmp_outdir)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
