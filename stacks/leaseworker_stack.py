"""The stack: composes the constructs, then does grants, environment wiring and outputs."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import ArnFormat, CfnOutput, Duration, Environment, Stack, Tags
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from stacks.config import PROJECT_TAG, SECRET_ARN_PATTERN, LeaseworkerConfig
from stacks.lease_table import LeaseTable
from stacks.notification_queue import NotificationQueue
from stacks.observability import Observability
from stacks.scaling import WorkerScaling
from stacks.sink import KinesisSink
from stacks.vocabulary import INDEX_BY_OWNER, INDEXES
from stacks.worker_service import HealthCheckTiming, WorkerService

WORKER_SOURCE = Path(__file__).resolve().parent.parent / "worker_src"
# The worker image is built for the task's architecture (on another host: through emulation).
IMAGE_PLATFORMS: dict[str, ecr_assets.Platform] = {
    "x86_64": ecr_assets.Platform.LINUX_AMD64,
    "arm64": ecr_assets.Platform.LINUX_ARM64,
}

# Exactly what the worker process calls (tests/infra/test_iam.py scans worker_src to keep this
# in step): conditional UpdateItems on connection items (acquire, claim, renew, release,
# checkpoint), on its own session and checkpoint items (heartbeat, fence, checkpoints), PutItem
# (a connect-budget take, a fencing stub for an absent owner: both conditional), GetItem
# and BatchGetItem (a connection, the session items, a fenced peer's connections), DeleteItem
# (reaping a fenced session that holds nothing), and Query on the GSIs: by-state-expiry
# (reconcile, session listing) and by-owner (what a fenced worker held); Scan on by-owner only
# (the sweep for owners whose session no longer exists: a KEYS_ONLY index). Table
# administration (a table Scan, DescribeTable, creating connections) is the CLI's, run with
# operator credentials, never the task role's.
TABLE_ITEM_ACTIONS: tuple[str, ...] = (
    "dynamodb:BatchGetItem",
    "dynamodb:DeleteItem",
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
)
INDEX_ACTIONS: tuple[str, ...] = ("dynamodb:Query",)
OWNER_INDEX_SCAN_ACTIONS: tuple[str, ...] = ("dynamodb:Scan",)
# Workers both notify peers and consume notifications (docs/design.md §6): SendMessage,
# ReceiveMessage, DeleteMessageBatch (authorised by sqs:DeleteMessage). The queue uses SSE-SQS,
# so no KMS permissions are needed.
QUEUE_ACTIONS: tuple[str, ...] = (
    "sqs:DeleteMessage",
    "sqs:ReceiveMessage",
    "sqs:SendMessage",
)
# Upstream credentials for `{{secret:NAME#KEY}}` templates (docs/design.md §4.2): only reading a
# value, only of the secrets context upstreamSecrets names. Not DescribeSecret (which
# `ISecret.grant_read` would add): the worker never calls it.
SECRET_ACTIONS: tuple[str, ...] = ("secretsmanager:GetSecretValue",)
# Not granted on purpose: cloudwatch:PutMetricData. Powertools Metrics writes EMF JSON to
# stdout; the awslogs driver ships it to CloudWatch Logs, which extracts the metrics. The
# execution role's logs:PutLogEvents is the only permission that path needs.


def upstream_secret_arn(stack: Stack, secret: str) -> str:
    """The IAM resource for one upstreamSecrets entry: an ARN as given; for a name, the ARN of
    that name in this stack's account and region, with `-??????` for the six random characters
    Secrets Manager appends to every secret ARN (`?` matches exactly one character, so the
    policy cannot reach a secret whose name merely starts with this one)."""
    if SECRET_ARN_PATTERN.fullmatch(secret):
        return secret
    return stack.format_arn(
        service="secretsmanager",
        resource="secret",
        resource_name=f"{secret}-??????",
        arn_format=ArnFormat.COLON_RESOURCE_NAME,
    )


class LeaseworkerStack(Stack):
    def __init__(self, scope: Construct, construct_id: str, *, config: LeaseworkerConfig) -> None:
        super().__init__(
            scope,
            construct_id,
            description="leaseworker: a Fargate fleet holding leased upstream WebSocket feeds",
            env=Environment(account=config.account, region=config.region),
            termination_protection=config.is_prod,
        )
        # Resource tags (CloudFormation also propagates them to what it creates).
        for key, value in (("project", PROJECT_TAG), ("stage", config.stage)):
            Tags.of(self).add(key, value)
        retain = config.is_prod
        log_retention = logs.RetentionDays.ONE_YEAR if retain else logs.RetentionDays.ONE_MONTH

        lease_table = LeaseTable(self, "LeaseTable", retain=retain)
        notifications = NotificationQueue(self, "Notifications", retain=retain)
        sink = (
            KinesisSink(
                self,
                "Sink",
                retain=retain,
                retention_hours=config.stream_retention_hours,
                shards=config.kinesis_shards,
            )
            if config.sink == "kinesis"
            else None
        )

        environment = {
            "TABLE_NAME": lease_table.table.table_name,
            "NOTIFY_QUEUE_URL": notifications.queue.queue_url,
            "SINK": sink.sink_spec() if sink is not None else config.sink,
            **config.worker_environment(),
        }
        workers = WorkerService(
            self,
            "Workers",
            image=ecs.ContainerImage.from_asset(
                str(WORKER_SOURCE), platform=IMAGE_PLATFORMS[config.cpu_architecture]
            ),
            collector_image=config.collector_image,
            cpu_architecture=config.cpu_architecture,
            environment=environment,
            cpu=config.task_cpu,
            memory_mib=config.task_memory_mib,
            stop_timeout=Duration.seconds(config.stop_timeout_seconds),
            health_check=HealthCheckTiming.derive(
                heartbeat_seconds=config.heartbeat_seconds, lease_seconds=config.lease_seconds
            ),
            min_tasks=config.min_tasks,
            nat_gateways=config.nat_gateway_count,
            log_retention=log_retention,
            retain=retain,
        )

        # --- Grants: exact actions on exact resources, all on the task role -----------------
        task_role = workers.task_role
        table = lease_table.table
        task_role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="LeaseTableItems", actions=list(TABLE_ITEM_ACTIONS), resources=[table.table_arn]
            )
        )
        task_role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="LeaseTableIndexes",
                actions=list(INDEX_ACTIONS),
                resources=[f"{table.table_arn}/index/{index}" for index in INDEXES],
            )
        )
        task_role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="OwnerIndexSweep",
                actions=list(OWNER_INDEX_SCAN_ACTIONS),
                resources=[f"{table.table_arn}/index/{INDEX_BY_OWNER}"],
            )
        )
        notifications.queue.grant(task_role, *QUEUE_ACTIONS)
        if sink is not None:
            sink.grant_produce(task_role)
        if config.upstream_secrets:
            task_role.add_to_principal_policy(
                iam.PolicyStatement(
                    sid="UpstreamSecrets",
                    actions=list(SECRET_ACTIONS),
                    resources=[upstream_secret_arn(self, s) for s in config.upstream_secrets],
                )
            )

        WorkerScaling(
            self,
            "Scaling",
            service=workers.service,
            namespace=config.metrics_namespace,
            min_tasks=config.min_tasks,
            max_tasks=config.max_tasks,
            target_connections_per_task=config.scale_target_connections,
            scale_in_cooldown=Duration.seconds(config.scale_in_cooldown_seconds),
            scale_out_cooldown=Duration.seconds(config.scale_out_cooldown_seconds),
        )
        observability = Observability(
            self,
            "Observability",
            namespace=config.metrics_namespace,
            table=table,
            index_names=INDEXES,
            dead_letter_queue=notifications.dead_letter_queue,
            service=workers.service,
            min_tasks=config.min_tasks,
            metrics_seconds=config.metrics_seconds,
            stream=sink.stream if sink is not None else None,
            alarm_email=config.alarm_email,
            retain=retain,
        )
        # A revision that cannot acquire or keep leases is rolled back (the circuit breaker
        # covers tasks that never get healthy).
        workers.service.enable_deployment_alarms(
            [a.alarm_name for a in observability.deployment_alarms],
            behavior=ecs.AlarmBehavior.ROLLBACK_ON_ALARM,
        )
        # CDK prints an INFO that an alarm named by reference may form a cycle with the
        # service. These alarms reference only worker metrics and the topic, never the service;
        # tests/infra/test_production.py proves the template acyclic.

        # --- Outputs: what operators and the CLI need --------------------------------------
        CfnOutput(self, "TableName", value=table.table_name, description="TABLE_NAME for the leaseworker CLI")
        CfnOutput(self, "NotifyQueueUrl", value=notifications.queue.queue_url, description="NOTIFY_QUEUE_URL")
        if sink is not None:
            CfnOutput(
                self, "SinkStreamName", value=sink.stream.stream_name, description="Kinesis sink stream"
            )
        CfnOutput(self, "ClusterName", value=workers.cluster.cluster_name)
        CfnOutput(self, "ServiceName", value=workers.service.service_name)
        CfnOutput(self, "AlarmTopicArn", value=observability.topic.topic_arn)
        CfnOutput(self, "DashboardName", value=observability.dashboard.dashboard_name)
