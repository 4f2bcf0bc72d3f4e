"""IAM: exact action lists on the right role (task role vs execution role), nothing broad."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.infra.conftest import REPO, Synth, synth


def role_statements(synth: Synth, role_property: str) -> list[dict[str, Any]]:
    """All statements of the policies attached to the task definition's task/execution role."""
    properties = synth.one("AWS::ECS::TaskDefinition")["Properties"]
    role_id = properties[role_property]["Fn::GetAtt"][0]
    role = synth.template_json["Resources"][role_id]
    (statement,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    # The task role's trust also carries source conditions (test_task_role_trusts_only_ecs_...).
    ignored = {"Condition"} if role_property == "TaskRoleArn" else set()
    trust = {k: v for k, v in statement.items() if k not in ignored}
    assert trust == {
        "Action": "sts:AssumeRole",
        "Effect": "Allow",
        "Principal": {"Service": "ecs-tasks.amazonaws.com"},
    }
    assert "ManagedPolicyArns" not in role["Properties"]
    assert "Policies" not in role["Properties"]
    statements: list[dict[str, Any]] = []
    for policy in synth.resources("AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            statements.extend(policy["Properties"]["PolicyDocument"]["Statement"])
    return statements


def actions_by_resource(statements: list[dict[str, Any]]) -> dict[str, set[str]]:
    """{resource (JSON, logical ids reduced to their construct prefix): {actions}}."""
    result: dict[str, set[str]] = {}
    for statement in statements:
        assert statement["Effect"] == "Allow"
        assert "NotAction" not in statement and "NotResource" not in statement
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        resources = (
            statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        )
        for resource in resources:
            result.setdefault(describe(resource), set()).update(actions)
    return result


def describe(resource: Any) -> str:
    """A readable resource name without hashed logical ids: 'LeaseTable.Arn', 'NotificationsQueue.Arn'."""
    text = json.dumps(resource)
    if resource == "*":
        return "*"
    if isinstance(resource, dict) and "Fn::GetAtt" in resource:
        logical_id, attribute = resource["Fn::GetAtt"]
        return f"{logical_id[:-8]}.{attribute}"
    if isinstance(resource, dict) and "Fn::Join" in resource:
        parts = resource["Fn::Join"][1]
        return "".join(describe(p) if isinstance(p, dict) else p for p in parts)
    return text.strip('"')


TASK_ROLE = {
    "*": {
        "xray:GetSamplingRules",
        "xray:GetSamplingTargets",
        "xray:PutTelemetryRecords",
        "xray:PutTraceSegments",
    },
    "LeaseTable.Arn": {
        "dynamodb:BatchGetItem",
        "dynamodb:DeleteItem",
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
    },
    "LeaseTable.Arn/index/by-state-expiry": {"dynamodb:Query"},
    "LeaseTable.Arn/index/by-owner": {"dynamodb:Query", "dynamodb:Scan"},
    "NotificationsQueue.Arn": {"sqs:DeleteMessage", "sqs:ReceiveMessage", "sqs:SendMessage"},
    "SinkStream.Arn": {"kinesis:PutRecords"},
}

EXECUTION_ROLE = {
    "arn:aws:ecr:us-east-1:123456789012:repository/cdk-hnb659fds-container-assets-123456789012-us-east-1": {
        "ecr:BatchCheckLayerAvailability",
        "ecr:BatchGetImage",
        "ecr:GetDownloadUrlForLayer",
    },
    "*": {"ecr:GetAuthorizationToken"},
    "WorkersLogs.Arn": {"logs:CreateLogStream", "logs:PutLogEvents"},
}


def test_task_role_exact_actions(default: Synth) -> None:
    assert actions_by_resource(role_statements(default, "TaskRoleArn")) == TASK_ROLE


def test_execution_role_exact_actions(default: Synth) -> None:
    assert actions_by_resource(role_statements(default, "ExecutionRoleArn")) == EXECUTION_ROLE


def test_task_role_without_kinesis_sink(custom: Synth) -> None:
    expected = {k: v for k, v in TASK_ROLE.items() if not k.startswith("SinkStream")}
    # CUSTOM also names upstream secrets (tests/infra/test_secrets_grant.py covers them).
    for resource in (
        "arn:aws:secretsmanager:eu-west-1:210987654321:secret:feeds/alpaca-??????",
        "arn:aws:secretsmanager:eu-west-1:210987654321:secret:feeds/binance-AbC123",
    ):
        expected[resource] = {"secretsmanager:GetSecretValue"}
    assert actions_by_resource(role_statements(custom, "TaskRoleArn")) == expected


def test_nothing_broad_anywhere(default: Synth) -> None:
    text = json.dumps(default.template_json)
    assert "FullAccess" not in text
    # EMF metrics travel through stdout -> awslogs; PutMetricData is deliberately not granted.
    assert "cloudwatch:PutMetricData" not in text
    for policy in default.resources("AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            assert all("*" not in action for action in actions), actions


# boto3 client methods -> the IAM action that authorises them.
CALL_ACTIONS = {
    "get_item": "dynamodb:GetItem",
    "put_item": "dynamodb:PutItem",
    "update_item": "dynamodb:UpdateItem",
    "delete_item": "dynamodb:DeleteItem",
    "query": "dynamodb:Query",
    "scan": "dynamodb:Scan",
    "batch_get_item": "dynamodb:BatchGetItem",
    "batch_write_item": "dynamodb:BatchWriteItem",
    "transact_write_items": "dynamodb:ConditionCheckItem",
    "describe_table": "dynamodb:DescribeTable",
    "send_message": "sqs:SendMessage",
    "send_message_batch": "sqs:SendMessage",
    "receive_message": "sqs:ReceiveMessage",
    "delete_message": "sqs:DeleteMessage",
    "delete_message_batch": "sqs:DeleteMessage",
    "change_message_visibility": "sqs:ChangeMessageVisibility",
    "get_queue_attributes": "sqs:GetQueueAttributes",
    "get_queue_url": "sqs:GetQueueUrl",
    "put_record": "kinesis:PutRecord",
    "put_records": "kinesis:PutRecords",
    "describe_stream": "kinesis:DescribeStream",
    "describe_stream_summary": "kinesis:DescribeStreamSummary",
    "list_shards": "kinesis:ListShards",
    "put_metric_data": "cloudwatch:PutMetricData",
    "get_secret_value": "secretsmanager:GetSecretValue",
    "describe_secret": "secretsmanager:DescribeSecret",
}
# Granted only when context names resources for them: GetSecretValue on upstreamSecrets.
CONTEXT_GRANTED = {"secretsmanager:GetSecretValue": {"upstreamSecrets": "feeds/alpaca"}}
# Operator and local tooling run with the operator's credentials, not the task role; so do the
# seeded fault suite, the consumer filter and the stream reader (a Kinesis consumer's code, not the
# worker's).
NOT_IN_THE_TASK = ("cli/", "local/", "feed/", "lease/admin.py", "chaos/", "consumer.py", "stream_reader.py")


def worker_calls() -> dict[str, set[str]]:
    """{IAM action: {files}} for every AWS call the deployed worker process can make."""
    package = REPO / "worker_src" / "leaseworker"
    pattern = re.compile(r"\.(" + "|".join(sorted(CALL_ACTIONS, key=len, reverse=True)) + r")\(")
    found: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative.startswith(NOT_IN_THE_TASK):
            continue
        for call in pattern.findall(path.read_text()):
            found.setdefault(CALL_ACTIONS[call], set()).add(relative)
    return found


def test_task_role_covers_every_call_the_worker_makes(default: Synth) -> None:
    """Contract with worker_src: a new AWS call in the worker fails here until it is granted."""
    granted = set().union(*actions_by_resource(role_statements(default, "TaskRoleArn")).values())
    calls = worker_calls()
    missing = {
        action: files for action, files in calls.items() if action not in granted | set(CONTEXT_GRANTED)
    }
    assert missing == {}, f"grant these in stacks/leaseworker_stack.py (or stacks/sink.py): {missing}"
    # And nothing data-plane is granted that the worker never calls (X-Ray is the sidecar's).
    unused = {a for a in granted if not a.startswith("xray:")} - set(calls)
    assert unused == set()


@pytest.mark.parametrize(("action", "context"), sorted(CONTEXT_GRANTED.items()))
def test_context_granted_calls_are_granted_when_context_asks(action: str, context: dict[str, str]) -> None:
    """The worker calls these only for what context names; with that context they are granted."""
    assert action in worker_calls(), f"{action} is no longer called: drop it from CONTEXT_GRANTED"
    granted = set().union(*actions_by_resource(role_statements(synth(context), "TaskRoleArn")).values())
    assert action in granted


def test_task_role_trusts_only_ecs_acting_for_this_account_and_region(default: Synth, custom: Synth) -> None:
    for built, account, region in (
        (default, "123456789012", "us-east-1"),
        (custom, custom.config.account, "eu-west-1"),
    ):
        (role,) = [
            r
            for r in built.resources("AWS::IAM::Role").values()
            if r["Metadata"]["aws:cdk:path"].endswith("/TaskDefinition/TaskRole/Resource")
        ]
        (statement,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        assert statement["Principal"] == {"Service": "ecs-tasks.amazonaws.com"}
        assert statement["Condition"] == {
            "StringEquals": {"aws:SourceAccount": account},
            "ArnLike": {"aws:SourceArn": f"arn:aws:ecs:{region}:{account}:*"},
        }
