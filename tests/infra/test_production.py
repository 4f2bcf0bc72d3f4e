"""Issue 7: alarms reach the topic, health and safe deploys, network, table hygiene, tags."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from aws_cdk.assertions import Capture, Match

from stacks import observability
from stacks.config import ConfigError
from stacks.worker_service import HealthCheckTiming, max_healthy_percent
from tests.infra.conftest import REPO, Synth, container_environment
from tests.infra.conftest import synth as synthesize

CLOUDWATCH_CONDITIONS = {
    "StringEquals": {"aws:SourceAccount": "123456789012"},
    "ArnLike": {"aws:SourceArn": "arn:aws:cloudwatch:us-east-1:123456789012:alarm:*"},
}


def by_path(synth: Synth, resource_type: str, suffix: str) -> dict[str, Any]:
    found = [
        r
        for r in synth.resources(resource_type).values()
        if r["Metadata"]["aws:cdk:path"].endswith(f"/{suffix}/Resource")
    ]
    (resource,) = found
    return resource


def worker(synth: Synth) -> dict[str, Any]:
    task_definition = synth.one("AWS::ECS::TaskDefinition")
    (container,) = [c for c in task_definition["Properties"]["ContainerDefinitions"] if c["Name"] == "worker"]
    return container  # type: ignore[no-any-return]


# --- Point 4: alarms reach people --------------------------------------------------------


def test_topic_policy_allows_cloudwatch_to_publish_with_source_conditions(default: Synth) -> None:
    topic = Capture()
    default.template.has_resource_properties(
        "AWS::SNS::TopicPolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        {
                            "Sid": "AllowCloudWatchAlarmsToPublish",
                            "Effect": "Allow",
                            "Principal": {"Service": "cloudwatch.amazonaws.com"},
                            "Action": "sns:Publish",
                            "Resource": topic,
                            "Condition": CLOUDWATCH_CONDITIONS,
                        }
                    ]
                )
            }
        },
    )
    (topic_id,) = default.resources("AWS::SNS::Topic")
    assert topic.as_object() == {"Ref": topic_id}


def test_topic_key_statement_for_cloudwatch_has_the_same_conditions(default: Synth) -> None:
    default.template.has_resource_properties(
        "AWS::KMS::Key",
        {
            "KeyPolicy": {
                "Statement": Match.array_with(
                    [
                        {
                            "Sid": "AllowCloudWatchAlarmsToPublish",
                            "Effect": "Allow",
                            "Principal": {"Service": "cloudwatch.amazonaws.com"},
                            "Action": ["kms:Decrypt", "kms:GenerateDataKey*"],
                            "Resource": "*",
                            "Condition": CLOUDWATCH_CONDITIONS,
                        }
                    ]
                )
            }
        },
    )


def test_every_cloudwatch_grant_is_conditioned(default: Synth) -> None:
    """No statement anywhere lets cloudwatch.amazonaws.com in without both conditions."""
    for resource in default.template_json["Resources"].values():
        document = resource["Properties"].get("PolicyDocument") or resource["Properties"].get("KeyPolicy")
        for statement in (document or {}).get("Statement", []):
            if statement.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}:
                assert statement["Condition"] == CLOUDWATCH_CONDITIONS


def test_fleet_silent_alarm_breaches_on_missing_active_connections(default: Synth, custom: Synth) -> None:
    alarm = by_path(default, "AWS::CloudWatch::Alarm", "FleetSilentAlarm")["Properties"]
    assert (alarm["MetricName"], alarm["Statistic"], alarm["Period"]) == (
        "ActiveConnections",
        "SampleCount",
        60,
    )
    assert alarm["Dimensions"] == [{"Name": "service", "Value": "leaseworker"}]
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("LessThanThreshold", 1)
    assert alarm["TreatMissingData"] == "breaching"
    assert alarm["EvaluationPeriods"] == alarm["DatapointsToAlarm"] == 3
    # The period always holds one flush of every worker: metricsSeconds=15 keeps one minute.
    assert by_path(custom, "AWS::CloudWatch::Alarm", "FleetSilentAlarm")["Properties"]["Period"] == 60


def test_running_tasks_below_min_alarm_uses_container_insights(default: Synth, custom: Synth) -> None:
    for synth in (default, custom):
        alarm = by_path(synth, "AWS::CloudWatch::Alarm", "RunningTasksBelowMinimumAlarm")["Properties"]
        assert (alarm["Namespace"], alarm["MetricName"]) == ("ECS/ContainerInsights", "RunningTaskCount")
        (service_id,) = synth.resources("AWS::ECS::Service")
        (cluster_id,) = synth.resources("AWS::ECS::Cluster")
        assert {d["Name"]: d["Value"] for d in alarm["Dimensions"]} == {
            "ClusterName": {"Ref": cluster_id},
            "ServiceName": {"Fn::GetAtt": [service_id, "Name"]},
        }
        assert (alarm["ComparisonOperator"], alarm["Threshold"]) == (
            "LessThanThreshold",
            synth.config.min_tasks,
        )
        assert alarm["TreatMissingData"] == "breaching"
    assert (
        by_path(custom, "AWS::CloudWatch::Alarm", "RunningTasksBelowMinimumAlarm")["Properties"]["Threshold"]
        == 2
    )


def math_queries(synth: Synth) -> list[list[dict[str, Any]]]:
    return [
        r["Properties"]["Metrics"]
        for r in synth.resources("AWS::CloudWatch::Alarm").values()
        if "Metrics" in r["Properties"]
    ]


def test_metric_math_fills_every_sparse_operand(default: Synth) -> None:
    queries = math_queries(default)
    assert len(queries) == 2  # lost + fenced, and the table throttles
    for metrics in queries:
        (expression,) = [m["Expression"] for m in metrics if "Expression" in m]
        operands = [m["Id"] for m in metrics if "MetricStat" in m]
        assert operands
        for operand in operands:
            # Every occurrence of the operand is wrapped: FILL(id, 0).
            bare = re.findall(rf"\b{operand}\b", expression)
            filled = re.findall(rf"FILL\({operand}, 0\)", expression)
            assert len(bare) == len(filled) >= 1, (operand, expression)


def test_fill_sum_wraps_each_id() -> None:
    assert observability.fill_sum(["a", "b"]) == "FILL(a, 0) + FILL(b, 0)"


def test_throttle_alarm_covers_both_indexes(default: Synth) -> None:
    alarm = by_path(default, "AWS::CloudWatch::Alarm", "TableThrottlesAlarm")["Properties"]
    indexes = {
        next(
            (
                d["Value"]
                for d in q["MetricStat"]["Metric"]["Dimensions"]
                if d["Name"] == "GlobalSecondaryIndexName"
            ),
            None,
        )
        for q in alarm["Metrics"]
        if "MetricStat" in q
    }
    assert indexes == {None, "by-state-expiry", "by-owner"}


# --- Point 5: health and safe deploys ----------------------------------------------------


def test_worker_health_check_runs_leaseworker_health(default: Synth, custom: Synth) -> None:
    assert worker(default)["HealthCheck"] == {
        "Command": ["CMD", "leaseworker", "health"],
        "Interval": 10,  # 2 heartbeats of 5 s
        "Timeout": 5,
        "Retries": 2,  # ceil(20 s lease / 10 s)
        "StartPeriod": 40,  # 2 leases
    }
    # heartbeatSeconds=8, leaseSeconds=40 in the custom synth.
    check = worker(custom)["HealthCheck"]
    assert (check["Interval"], check["Retries"], check["StartPeriod"]) == (16, 3, 80)
    # The collector has none: it is not essential.
    task_definition = default.one("AWS::ECS::TaskDefinition")
    collector = next(
        c for c in task_definition["Properties"]["ContainerDefinitions"] if c["Name"] != "worker"
    )
    assert "HealthCheck" not in collector


@pytest.mark.parametrize(("heartbeat", "lease"), [(1, 3), (5, 20), (60, 180), (200, 600)])
def test_health_check_timing_stays_within_ecs_limits(heartbeat: int, lease: int) -> None:
    timing = HealthCheckTiming.derive(heartbeat_seconds=heartbeat, lease_seconds=lease)
    assert 5 <= timing.interval <= 300
    assert 2 <= timing.timeout <= 60 and timing.timeout <= timing.interval
    assert 1 <= timing.retries <= 10
    assert 0 <= timing.start_period <= 300
    # Unhealthy after roughly one lease of failures (never less than one lease, ECS permitting).
    assert timing.interval * timing.retries >= min(lease, 300 * 10)


def test_deployment_alarms_roll_back(default: Synth) -> None:
    names = Capture()
    default.template.has_resource_properties(
        "AWS::ECS::Service",
        {
            "DeploymentConfiguration": Match.object_like(
                {"Alarms": {"AlarmNames": names, "Enable": True, "Rollback": True}}
            )
        },
    )
    referenced = {n["Ref"] for n in names.as_array()}
    paths = {
        default.template_json["Resources"][r]["Metadata"]["aws:cdk:path"].split("/")[-2] for r in referenced
    }
    assert paths == set(observability.DEPLOYMENT_ALARMS)
    # None of them breaches on missing data: an idle new stack never rolls itself back.
    for logical_id in referenced:
        assert (
            default.template_json["Resources"][logical_id]["Properties"]["TreatMissingData"] == "notBreaching"
        )


def test_deployments_replace_tasks_in_batches(default: Synth, custom: Synth) -> None:
    for synth in (default, custom):
        config = synth.one("AWS::ECS::Service")["Properties"]["DeploymentConfiguration"]
        assert config["MinimumHealthyPercent"] == 100
        assert config["MaximumPercent"] == max_healthy_percent(synth.config.min_tasks)
    # minTasks=2 in the custom synth: batches of half the fleet, never all of it.
    assert custom.one("AWS::ECS::Service")["Properties"]["DeploymentConfiguration"]["MaximumPercent"] == 150


@pytest.mark.parametrize("min_tasks", [1, 2, 3, 4, 7, 10, 50])
def test_max_healthy_percent_always_lets_one_task_start(min_tasks: int) -> None:
    percent = max_healthy_percent(min_tasks)
    assert 125 <= percent <= 200
    for desired in range(min_tasks, min_tasks + 40):
        batch = desired * percent // 100 - desired  # ECS rounds the maximum down
        assert batch >= 1, (desired, percent)
        if min_tasks >= 4:
            assert batch <= max(1, desired // 2)


def test_worker_root_filesystem_read_only_with_writable_tmp(default: Synth) -> None:
    container = worker(default)
    assert container["ReadonlyRootFilesystem"] is True
    assert container["MountPoints"] == [{"ContainerPath": "/tmp", "ReadOnly": False, "SourceVolume": "tmp"}]
    volumes = default.one("AWS::ECS::TaskDefinition")["Properties"]["Volumes"]
    # A task volume without a host path: Fargate ephemeral storage, writable, per task.
    assert volumes == [{"Name": "tmp"}]
    # The default health file path lives on that volume.
    assert "LEASEWORKER_HEALTH_FILE" not in container_environment(default.template_json)


# --- Point 6: network ----------------------------------------------------------------------


def test_dynamodb_and_s3_gateway_endpoints_on_the_private_route_tables(default: Synth) -> None:
    endpoints = {
        e["Properties"]["ServiceName"]["Fn::Join"][1][2]: e["Properties"]
        for e in default.resources("AWS::EC2::VPCEndpoint").values()
    }
    assert sorted(endpoints) == [".dynamodb", ".s3"]
    (service,) = default.resources("AWS::ECS::Service").values()
    subnets = {
        s["Ref"] for s in service["Properties"]["NetworkConfiguration"]["AwsvpcConfiguration"]["Subnets"]
    }
    worker_route_tables = {
        a["Properties"]["RouteTableId"]["Ref"]
        for a in default.resources("AWS::EC2::SubnetRouteTableAssociation").values()
        if a["Properties"]["SubnetId"]["Ref"] in subnets
    }
    for endpoint in endpoints.values():
        assert endpoint["VpcEndpointType"] == "Gateway"
        assert {r["Ref"] for r in endpoint["RouteTableIds"]} == worker_route_tables
    assert len(worker_route_tables) == 2


def test_service_waits_for_the_private_routes_and_endpoints(default: Synth) -> None:
    """A first create never starts a task before its subnets can reach ECR and the feeds."""
    resources = default.template_json["Resources"]
    (service,) = default.resources("AWS::ECS::Service").values()
    depends_on = set(service["DependsOn"])
    (service_props,) = [service["Properties"]]
    subnets = {s["Ref"] for s in service_props["NetworkConfiguration"]["AwsvpcConfiguration"]["Subnets"]}
    route_tables = {
        a["Properties"]["RouteTableId"]["Ref"]
        for a in default.resources("AWS::EC2::SubnetRouteTableAssociation").values()
        if a["Properties"]["SubnetId"]["Ref"] in subnets
    }
    nat_routes = {
        k
        for k, r in default.resources("AWS::EC2::Route").items()
        if r["Properties"]["RouteTableId"]["Ref"] in route_tables and "NatGatewayId" in r["Properties"]
    }
    assert len(nat_routes) == 2
    assert nat_routes <= depends_on
    endpoints = set(default.resources("AWS::EC2::VPCEndpoint"))
    assert len(endpoints) == 2
    assert endpoints <= depends_on
    assert all(resources[d]["Type"] != "AWS::ECS::Service" for d in depends_on)


def test_tasks_carry_the_service_tags(default: Synth) -> None:
    properties = default.one("AWS::ECS::Service")["Properties"]
    assert properties["PropagateTags"] == "SERVICE"
    assert properties["EnableECSManagedTags"] is True


def test_arm64_runs_graviton_and_builds_the_image_for_it(default: Synth, custom: Synth) -> None:
    for synth, cpu, platform in ((default, "X86_64", "linux/amd64"), (custom, "ARM64", "linux/arm64")):
        runtime = synth.one("AWS::ECS::TaskDefinition")["Properties"]["RuntimePlatform"]
        assert runtime == {"CpuArchitecture": cpu, "OperatingSystemFamily": "LINUX"}
        (assets,) = synth.outdir.glob(f"{synth.stack.artifact_id}.assets.json")
        images = json.loads(assets.read_text())["dockerImages"]
        assert [i["source"]["platform"] for i in images.values()] == [platform]


# --- Prod defaults: `-c stage=prod` alone ---------------------------------------------------------


@pytest.fixture(scope="module")
def prod() -> Synth:
    return synthesize({"stage": "prod"})


def test_prod_runs_two_tasks_in_half_fleet_batches(prod: Synth) -> None:
    assert prod.one("AWS::ApplicationAutoScaling::ScalableTarget")["Properties"]["MinCapacity"] == 2
    deployment = prod.one("AWS::ECS::Service")["Properties"]["DeploymentConfiguration"]
    assert (deployment["MinimumHealthyPercent"], deployment["MaximumPercent"]) == (100, 150)
    assert len(prod.resources("AWS::EC2::NatGateway")) == 2


def test_prod_stream_is_retained_for_a_week(default: Synth, prod: Synth) -> None:
    stream = prod.one("AWS::Kinesis::Stream")
    assert (stream["DeletionPolicy"], stream["UpdateReplacePolicy"]) == ("Retain", "Retain")
    assert stream["Properties"]["RetentionPeriodHours"] == 168
    dev = default.one("AWS::Kinesis::Stream")
    assert (dev["DeletionPolicy"], dev["Properties"]["RetentionPeriodHours"]) == ("Delete", 24)
    changed = synthesize({"stage": "prod", "kinesisRetentionHours": "72"})
    assert changed.one("AWS::Kinesis::Stream")["Properties"]["RetentionPeriodHours"] == 72


def test_kinesis_shards_make_a_provisioned_stream(default: Synth) -> None:
    on_demand = default.one("AWS::Kinesis::Stream")["Properties"]
    assert on_demand["StreamModeDetails"] == {"StreamMode": "ON_DEMAND"}
    assert "ShardCount" not in on_demand
    provisioned = synthesize({"kinesisShards": "2"}).one("AWS::Kinesis::Stream")["Properties"]
    assert (provisioned["StreamModeDetails"], provisioned["ShardCount"]) == ({"StreamMode": "PROVISIONED"}, 2)


def test_prod_single_task_only_when_explicit() -> None:
    with pytest.raises(ConfigError, match="allowSingleTaskProd=true"):
        synthesize({"stage": "prod", "minTasks": "1"})
    single = synthesize({"stage": "prod", "minTasks": "1", "allowSingleTaskProd": "true"})
    assert single.one("AWS::ApplicationAutoScaling::ScalableTarget")["Properties"]["MinCapacity"] == 1


# --- Point 9: hygiene ----------------------------------------------------------------------


def test_table_ttl_on_purge_at_and_sparse_by_owner_index(default: Synth) -> None:
    default.template.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "TimeToLiveSpecification": {"AttributeName": "purge_at", "Enabled": True},
            "AttributeDefinitions": Match.array_with(
                [{"AttributeName": "lease_owner", "AttributeType": "S"}]
            ),
            "GlobalSecondaryIndexes": Match.array_with(
                [
                    {
                        "IndexName": "by-owner",
                        "KeySchema": [{"AttributeName": "lease_owner", "KeyType": "HASH"}],
                        "Projection": {"ProjectionType": "KEYS_ONLY"},
                    }
                ]
            ),
        },
    )


def test_service_dimension_is_the_powertools_service_name(default: Synth) -> None:
    service_name = container_environment(default.template_json)["POWERTOOLS_SERVICE_NAME"]
    text = json.dumps(default.template_json)
    dimension_values = re.findall(r'\{"Name": "service", "Value": "([^"]*)"\}', text)
    dashboard_values = re.findall(r'\\"service\\",\\"([^\\]*)\\"', text)
    assert dimension_values and dashboard_values
    assert set(dimension_values) | set(dashboard_values) == {service_name}


def test_project_and_stage_tags(default: Synth, custom: Synth) -> None:
    for synth, stage in ((default, "dev"), (custom, "prod")):
        for resource_type in ("AWS::DynamoDB::Table", "AWS::ECS::Service", "AWS::SNS::Topic"):
            tags = synth.one(resource_type)["Properties"]["Tags"]
            assert {"Key": "project", "Value": "leaseworker"} in tags
            assert {"Key": "stage", "Value": stage} in tags


def test_custom_resource_handlers_log_to_a_retained_group(default: Synth, custom: Synth) -> None:
    for synth, days in ((default, 30), (custom, 365)):
        functions = synth.resources("AWS::Lambda::Function")
        assert functions
        for function in functions.values():
            group = function["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
            assert synth.template_json["Resources"][group]["Properties"]["RetentionInDays"] == days
            assert group in function["DependsOn"]
    # Every log group in the stack has a retention.
    for group in default.resources("AWS::Logs::LogGroup").values():
        assert group["Properties"]["RetentionInDays"] == 30


def dashboard_widgets(synth: Synth) -> dict[str, list[list[Any]]]:
    """{widget title: its metric arrays}, the body's tokens replaced by "<token>"."""
    body = synth.one("AWS::CloudWatch::Dashboard")["Properties"]["DashboardBody"]
    parts = body["Fn::Join"][1] if isinstance(body, dict) else [body]
    text = "".join(p if isinstance(p, str) else "<token>" for p in parts)
    widgets = json.loads(text)["widgets"]
    return {
        w["properties"]["title"]: w["properties"].get("metrics", [])
        for w in widgets
        if "title" in w["properties"]
    }


def test_dashboard_shows_the_fleet_the_indexes_and_the_sink(default: Synth, custom: Synth) -> None:
    widgets = dashboard_widgets(default)
    shown = {(m[0], m[1]) for metrics in widgets.values() for m in metrics}
    for metric in ("RunningTaskCount", "CpuUtilized", "MemoryUtilized"):
        assert ("ECS/ContainerInsights", metric) in shown, metric
    index_reads = widgets["Index read throttles"]
    assert {(m[1], m[m.index("GlobalSecondaryIndexName") + 1]) for m in index_reads} == {
        ("ReadThrottleEvents", "by-state-expiry"),
        ("ReadThrottleEvents", "by-owner"),
    }
    assert ("AWS/Kinesis", "PutRecords.ThrottledRecords") in shown
    custom_shown = {m[0] for metrics in dashboard_widgets(custom).values() for m in metrics}
    assert "AWS/Kinesis" not in custom_shown  # sink=null: no stream


def references(value: Any) -> set[str]:
    """Logical ids a template value refers to (Ref, Fn::GetAtt)."""
    if isinstance(value, dict):
        found: set[str] = set()
        if "Ref" in value and isinstance(value["Ref"], str):
            found.add(value["Ref"])
        if "Fn::GetAtt" in value:
            found.add(value["Fn::GetAtt"][0])
        for item in value.values():
            found |= references(item)
        return found
    if isinstance(value, list):
        return set().union(*(references(v) for v in value)) if value else set()
    return set()


def test_deployment_alarms_form_no_dependency_cycle(default: Synth) -> None:
    resources = default.template_json["Resources"]
    edges = {
        logical_id: (references(r.get("Properties", {})) | set(r.get("DependsOn", []))) & set(resources)
        for logical_id, r in resources.items()
    }
    visiting: set[str] = set()
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in visiting, f"cycle: {' -> '.join((*path, node))}"
        if node in done:
            return
        visiting.add(node)
        for target in edges[node]:
            visit(target, (*path, node))
        visiting.discard(node)
        done.add(node)

    for node in edges:
        visit(node, ())
    # And the service does depend on the alarms (so the check covers the deployment alarms).
    (service_id,) = default.resources("AWS::ECS::Service")
    assert any("Alarm" in target for target in edges[service_id])


def test_another_region_synthesizes_offline() -> None:
    """`-c region=eu-west-1` needs no lookup: cdk.context.json carries the placeholder account's
    AZ facts for the common regions (a real account's are looked up once by the CLI)."""
    facts = json.loads((REPO / "cdk.context.json").read_text())
    for key, zones in facts.items():
        region = key.rsplit("region=", 1)[1]
        assert len(zones) >= 2 and all(zone.startswith(region) for zone in zones), key
    other = synthesize({"region": "eu-west-1"})
    zones = {s["Properties"]["AvailabilityZone"] for s in other.resources("AWS::EC2::Subnet").values()}
    assert zones == {"eu-west-1a", "eu-west-1b"}
    assert other.stack.region == "eu-west-1"
