"""Property-level assertions per construct, on the default and on the all-custom synth."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from aws_cdk.assertions import Capture, Match

from stacks import metrics
from tests.infra.conftest import Synth

# --- Lease table --------------------------------------------------------------------------


def test_lease_table_key_schema_and_gsi(default: Synth) -> None:
    default.template.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "KeySchema": [{"AttributeName": "connection_id", "KeyType": "HASH"}],
            "AttributeDefinitions": Match.array_equals(
                [
                    {"AttributeName": "connection_id", "AttributeType": "S"},
                    {"AttributeName": "desired_state", "AttributeType": "S"},
                    {"AttributeName": "lease_expires_at_ms", "AttributeType": "N"},
                    {"AttributeName": "lease_owner", "AttributeType": "S"},
                ]
            ),
            "GlobalSecondaryIndexes": [
                {
                    "IndexName": "by-state-expiry",
                    "KeySchema": [
                        {"AttributeName": "desired_state", "KeyType": "HASH"},
                        {"AttributeName": "lease_expires_at_ms", "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                },
                {
                    "IndexName": "by-owner",
                    "KeySchema": [{"AttributeName": "lease_owner", "KeyType": "HASH"}],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                },
            ],
            "BillingMode": "PAY_PER_REQUEST",
            "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
            "SSESpecification": {"SSEEnabled": True},
            "TableName": Match.absent(),
        },
    )


def test_stage_sets_removal_policy_and_deletion_protection(default: Synth, custom: Synth) -> None:
    dev, prod = default.one("AWS::DynamoDB::Table"), custom.one("AWS::DynamoDB::Table")
    assert (dev["DeletionPolicy"], dev["Properties"]["DeletionProtectionEnabled"]) == ("Delete", False)
    assert (prod["DeletionPolicy"], prod["Properties"]["DeletionProtectionEnabled"]) == ("Retain", True)
    for resource_type in ("AWS::SQS::Queue", "AWS::Logs::LogGroup", "AWS::KMS::Key"):
        assert {r["DeletionPolicy"] for r in default.resources(resource_type).values()} == {"Delete"}
        assert {r["DeletionPolicy"] for r in custom.resources(resource_type).values()} == {"Retain"}
    assert default.stack.termination_protection is False
    assert custom.stack.termination_protection is True


def test_no_physical_names(default: Synth) -> None:
    named = {
        "AWS::DynamoDB::Table": "TableName",
        "AWS::SQS::Queue": "QueueName",
        "AWS::Kinesis::Stream": "Name",
        "AWS::SNS::Topic": "TopicName",
        "AWS::IAM::Role": "RoleName",
        "AWS::ECS::Cluster": "ClusterName",
        "AWS::ECS::Service": "ServiceName",
        "AWS::Logs::LogGroup": "LogGroupName",
        "AWS::CloudWatch::Dashboard": "DashboardName",
        "AWS::CloudWatch::Alarm": "AlarmName",
    }
    for resource_type, name_property in named.items():
        for logical_id, resource in default.resources(resource_type).items():
            assert name_property not in resource.get("Properties", {}), logical_id


# --- Notification queue --------------------------------------------------------------------


def test_queue_encrypted_with_dlq_and_tls_only(default: Synth) -> None:
    dlq_arn = Capture()
    default.template.has_resource_properties(
        "AWS::SQS::Queue",
        {
            "SqsManagedSseEnabled": True,
            "RedrivePolicy": {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 5},
        },
    )
    dlq_id = dlq_arn.as_object()["Fn::GetAtt"][0]
    assert default.template_json["Resources"][dlq_id]["Properties"]["SqsManagedSseEnabled"] is True
    policies = default.resources("AWS::SQS::QueuePolicy")
    assert len(policies) == 2
    for policy in policies.values():
        (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
        assert statement["Effect"] == "Deny"
        assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


# --- Network and service -------------------------------------------------------------------


def worker_container(synth: Synth, name: str = "worker") -> dict[str, Any]:
    task_definition = synth.one("AWS::ECS::TaskDefinition")
    containers: list[dict[str, Any]] = task_definition["Properties"]["ContainerDefinitions"]
    (container,) = [c for c in containers if c["Name"] == name]
    return container


def test_stop_timeout_matches_config_and_fargate_limit(default: Synth, custom: Synth) -> None:
    for synth in (default, custom):
        stop_timeout = worker_container(synth)["StopTimeout"]
        assert stop_timeout == synth.config.stop_timeout_seconds <= 120
        env = worker_container(synth)["Environment"]
        assert {"Name": "SHUTDOWN_GRACE_SECONDS", "Value": str(stop_timeout)} in env
    assert worker_container(custom)["StopTimeout"] == 90


def test_worker_container_limits_logging_and_image(default: Synth) -> None:
    container = worker_container(default)
    assert container["Essential"] is True
    assert container["Ulimits"] == [{"Name": "nofile", "SoftLimit": 65536, "HardLimit": 65536}]
    options = container["LogConfiguration"]["Options"]
    assert container["LogConfiguration"]["LogDriver"] == "awslogs"
    assert options["mode"] == "non-blocking"
    # The image is the worker_src asset, pushed to the bootstrap repository.
    assert "container-assets" in json.dumps(container["Image"])
    assert re.search(r":[0-9a-f]{64}", json.dumps(container["Image"]))
    log_group = options["awslogs-group"]["Ref"]
    retention = default.template_json["Resources"][log_group]["Properties"]["RetentionInDays"]
    assert retention == 30


def test_adot_sidecar_pinned_otlp_to_xray(default: Synth) -> None:
    collector = worker_container(default, "otel-collector")
    # Pinned by tag and by the digest of its multi-architecture index (never :latest).
    assert re.fullmatch(
        r"public\.ecr\.aws/aws-observability/aws-otel-collector:v\d+\.\d+\.\d+@sha256:[0-9a-f]{64}",
        collector["Image"],
    )
    assert collector["Command"] == ["--config=/etc/ecs/ecs-xray.yaml"]
    assert collector["Essential"] is False
    assert collector["Memory"] == 256
    assert worker_container(default)["DependsOn"] == [
        {"ContainerName": "otel-collector", "Condition": "START"}
    ]
    env = {e["Name"]: e["Value"] for e in worker_container(default)["Environment"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://localhost:4318"


def test_task_size_from_config(default: Synth, custom: Synth) -> None:
    for synth, cpu, memory in ((default, "512", "1024"), (custom, "1024", "3072")):
        properties = synth.one("AWS::ECS::TaskDefinition")["Properties"]
        assert (properties["Cpu"], properties["Memory"]) == (cpu, memory)
        assert properties["RequiresCompatibilities"] == ["FARGATE"]


def test_service_private_no_public_ip_circuit_breaker(default: Synth) -> None:
    properties = default.one("AWS::ECS::Service")["Properties"]
    network = properties["NetworkConfiguration"]["AwsvpcConfiguration"]
    assert network["AssignPublicIp"] == "DISABLED"
    private_subnets = {
        k
        for k, r in default.resources("AWS::EC2::Subnet").items()
        if r["Properties"]["MapPublicIpOnLaunch"] is False
    }
    assert {s["Ref"] for s in network["Subnets"]} == private_subnets
    assert len(private_subnets) == 2
    assert properties["DeploymentConfiguration"]["DeploymentCircuitBreaker"] == {
        "Enable": True,
        "Rollback": True,
    }
    assert properties["LaunchType"] == "FARGATE"
    assert properties["EnableExecuteCommand"] is False
    # No ingress at all: the workers only dial out, over TCP only.
    (group_id,) = [g["Fn::GetAtt"][0] for g in network["SecurityGroups"]]
    security_group = default.template_json["Resources"][group_id]["Properties"]
    assert "SecurityGroupIngress" not in security_group
    assert security_group["SecurityGroupEgress"] == [
        {
            "CidrIp": "0.0.0.0/0",
            "Description": "upstream feeds and AWS APIs (TCP only)",
            "FromPort": 0,
            "IpProtocol": "tcp",
            "ToPort": 65535,
        }
    ]


def test_container_insights_and_flow_logs(default: Synth) -> None:
    default.template.has_resource_properties(
        "AWS::ECS::Cluster", {"ClusterSettings": [{"Name": "containerInsights", "Value": "enabled"}]}
    )
    default.template.has_resource_properties(
        "AWS::EC2::FlowLog",
        {"ResourceType": "VPC", "TrafficType": "ALL", "LogDestinationType": "cloud-watch-logs"},
    )


def test_nat_gateways_from_config(default: Synth, custom: Synth) -> None:
    assert len(default.resources("AWS::EC2::NatGateway")) == 1
    assert len(custom.resources("AWS::EC2::NatGateway")) == 2
    # Every private subnet routes 0.0.0.0/0 through a NAT gateway (workers reach upstream feeds).
    nat_routes = [
        r for r in default.resources("AWS::EC2::Route").values() if "NatGatewayId" in r["Properties"]
    ]
    assert len(nat_routes) == 2


# --- Scaling -------------------------------------------------------------------------------


def test_scaling_tracks_average_active_connections(default: Synth, custom: Synth) -> None:
    for synth in (default, custom):
        config = synth.config
        synth.template.has_resource_properties(
            "AWS::ApplicationAutoScaling::ScalingPolicy",
            {
                "PolicyType": "TargetTrackingScaling",
                "TargetTrackingScalingPolicyConfiguration": {
                    "CustomizedMetricSpecification": {
                        "MetricName": "ActiveConnections",
                        "Namespace": config.metrics_namespace,
                        "Dimensions": [{"Name": "service", "Value": "leaseworker"}],
                        "Statistic": "Average",
                    },
                    "TargetValue": config.scale_target_connections,
                    "ScaleInCooldown": config.scale_in_cooldown_seconds,
                    "ScaleOutCooldown": config.scale_out_cooldown_seconds,
                },
            },
        )
        synth.template.has_resource_properties(
            "AWS::ApplicationAutoScaling::ScalableTarget",
            {
                "MinCapacity": config.min_tasks,
                "MaxCapacity": config.max_tasks,
                "ScalableDimension": "ecs:service:DesiredCount",
            },
        )
    custom_policy = custom.one("AWS::ApplicationAutoScaling::ScalingPolicy")["Properties"]
    spec = custom_policy["TargetTrackingScalingPolicyConfiguration"]
    assert (spec["TargetValue"], spec["ScaleInCooldown"], spec["ScaleOutCooldown"]) == (400, 600, 30)
    assert spec["CustomizedMetricSpecification"]["Namespace"] == "Custom/Leaseworker"


# --- Observability -------------------------------------------------------------------------


def alarm_by_path(synth: Synth, name: str) -> dict[str, Any]:
    alarms: list[dict[str, Any]] = [
        r["Properties"]
        for r in synth.resources("AWS::CloudWatch::Alarm").values()
        if r["Metadata"]["aws:cdk:path"].endswith(f"/{name}/Resource")
    ]
    (alarm,) = alarms
    return alarm


def worker_metric_stat(name: str, namespace: str = "Leaseworker") -> dict[str, Any]:
    return {
        "Metric": {
            "MetricName": name,
            "Namespace": namespace,
            "Dimensions": [{"Name": "service", "Value": "leaseworker"}],
        },
        "Period": 60,
        "Stat": "Sum",
    }


def test_single_metric_alarms(default: Synth) -> None:
    expected = {
        "LeaseAcquireFailuresAlarm": (metrics.LEASE_ACQUIRE_FAILURES, 1, 3, 3),
        "OrphansPersistingAlarm": (metrics.ORPHANS_SEEN, 1, 5, 5),
        "SinkErrorsAlarm": (metrics.SINK_ERRORS, 1, 3, 3),
        "LeasesRepairedAlarm": (metrics.LEASES_REPAIRED, 1, 1, 1),  # any repair: look at once
    }
    topic = Match.object_like({"Ref": Match.string_like_regexp("AlarmTopic")})
    for name, (metric, threshold, periods, datapoints) in expected.items():
        alarm = alarm_by_path(default, name)
        assert alarm["MetricName"] == metric
        assert alarm["Namespace"] == "Leaseworker"
        assert alarm["Dimensions"] == [{"Name": "service", "Value": "leaseworker"}]
        assert (alarm["Statistic"], alarm["Period"]) == ("Sum", 60)
        assert (alarm["Threshold"], alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"]) == (
            threshold,
            periods,
            datapoints,
        )
        assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
        assert alarm["TreatMissingData"] == "notBreaching"
        assert len(alarm["AlarmActions"]) == 1
        assert topic.test(alarm["AlarmActions"][0]).has_failed() is False


def test_lost_or_fenced_alarm_sums_both(default: Synth) -> None:
    alarm = alarm_by_path(default, "LeasesLostOrSelfFencedAlarm")
    assert (alarm["Threshold"], alarm["EvaluationPeriods"]) == (1, 1)
    stats = {m["Id"]: m.get("MetricStat") for m in alarm["Metrics"]}
    expression = [m["Expression"] for m in alarm["Metrics"] if "Expression" in m]
    assert expression == ["FILL(lost, 0) + FILL(fenced, 0)"]
    assert stats["lost"] == worker_metric_stat("LeasesLost")
    assert stats["fenced"] == worker_metric_stat("SelfFenced")


def test_table_throttle_alarm_covers_table_and_gsi(default: Synth) -> None:
    alarm = alarm_by_path(default, "TableThrottlesAlarm")
    assert (alarm["Threshold"], alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"]) == (1, 3, 2)
    table_id = next(iter(default.resources("AWS::DynamoDB::Table")))
    seen = set()
    for query in alarm["Metrics"]:
        if "MetricStat" not in query:
            continue
        metric = query["MetricStat"]["Metric"]
        assert metric["Namespace"] == "AWS/DynamoDB"
        dimensions = {d["Name"]: d["Value"] for d in metric["Dimensions"]}
        assert dimensions["TableName"] == {"Ref": table_id}
        seen.add((metric["MetricName"], dimensions.get("GlobalSecondaryIndexName")))
    assert seen == {
        ("ReadThrottleEvents", None),
        ("WriteThrottleEvents", None),
        ("ReadThrottleEvents", "by-state-expiry"),
        ("WriteThrottleEvents", "by-state-expiry"),
        ("ReadThrottleEvents", "by-owner"),
        ("WriteThrottleEvents", "by-owner"),
    }


def test_alarms_use_configured_namespace(custom: Synth) -> None:
    alarm = alarm_by_path(custom, "SinkErrorsAlarm")
    assert alarm["Namespace"] == "Custom/Leaseworker"


def test_topic_encrypted_tls_only_with_optional_email(default: Synth, custom: Synth) -> None:
    topic = default.one("AWS::SNS::Topic")["Properties"]
    key_id = topic["KmsMasterKeyId"]["Fn::GetAtt"][0]
    key = default.template_json["Resources"][key_id]["Properties"]
    assert key["EnableKeyRotation"] is True
    principals = [s.get("Principal") for s in key["KeyPolicy"]["Statement"]]
    assert {"Service": "cloudwatch.amazonaws.com"} in principals
    (policy,) = default.resources("AWS::SNS::TopicPolicy").values()
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert any(
        s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
        for s in statements
    )
    assert default.resources("AWS::SNS::Subscription") == {}
    custom.template.has_resource_properties(
        "AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": "ops@example.com"}
    )


def test_dashboard_shows_every_worker_metric(default: Synth) -> None:
    body = json.dumps(default.one("AWS::CloudWatch::Dashboard")["Properties"]["DashboardBody"])
    for name in metrics.ALL_METRICS:
        assert f'\\"Leaseworker\\",\\"{name}\\",\\"service\\",\\"leaseworker\\"' in body, name
    assert len(metrics.ALL_METRICS) == 22
    from leaseworker.observability.metrics import MetricName

    assert set(metrics.ALL_METRICS) == {name.value for name in MetricName}  # the worker's names


# --- Sink ----------------------------------------------------------------------------------


def test_kinesis_sink_on_demand_encrypted_and_wired(default: Synth) -> None:
    stream_id, stream = next(iter(default.resources("AWS::Kinesis::Stream").items()))
    assert stream["Properties"]["StreamModeDetails"] == {"StreamMode": "ON_DEMAND"}
    assert stream["Properties"]["StreamEncryption"] == {"EncryptionType": "KMS", "KeyId": "alias/aws/kinesis"}
    env = {e["Name"]: e["Value"] for e in worker_container(default)["Environment"]}
    assert env["SINK"] == {"Fn::Join": ["", ["kinesis:", {"Ref": stream_id}]]}


def test_no_stream_unless_sink_is_kinesis(custom: Synth) -> None:
    assert custom.resources("AWS::Kinesis::Stream") == {}
    env = {e["Name"]: e["Value"] for e in worker_container(custom)["Environment"]}
    assert env["SINK"] == "null"
    assert "kinesis:" not in json.dumps(custom.resources("AWS::IAM::Policy"))


def test_the_deployed_table_is_the_one_the_worker_creates_and_queries(default: Synth) -> None:
    """The stack and `leaseworker table create` state the same keys and indexes, from one
    vocabulary (worker_src/leaseworker/lease/vocabulary.py, loaded by stacks/vocabulary.py)."""
    import stacks.vocabulary
    from leaseworker.lease import vocabulary

    assert Path(vocabulary.__file__).resolve() == stacks.vocabulary.SOURCE
    table = default.one("AWS::DynamoDB::Table")["Properties"]
    schema: dict[str, Any] = vocabulary.TABLE_SCHEMA
    assert table["KeySchema"] == schema["KeySchema"]
    assert sorted(table["AttributeDefinitions"], key=_attribute_name) == sorted(
        schema["AttributeDefinitions"], key=_attribute_name
    )
    assert table["GlobalSecondaryIndexes"] == schema["GlobalSecondaryIndexes"]
    assert table["TimeToLiveSpecification"] == {"AttributeName": vocabulary.TTL_ATTRIBUTE, "Enabled": True}


def _attribute_name(definition: dict[str, str]) -> str:
    return definition["AttributeName"]
