"""Alarms and the alarm topic over the worker's metrics (docs/design.md §8, §9)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kinesis as kinesis
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from stacks import metrics
from stacks.dashboard import build_dashboard

PERIOD = Duration.minutes(1)

# Alarm policy, one place. Counts are fleet-wide sums per one-minute period.
# - LeaseAcquireFailures counts errors and throttles, never lost races: a few are expected
#   during a DynamoDB blip, three bad minutes in a row are not.
ACQUIRE_FAILURES_THRESHOLD = 1
ACQUIRE_FAILURES_PERIODS = 3
# - A lost or self-fenced lease means a renewal did not land within the lease: page at once.
LOST_OR_FENCED_THRESHOLD = 1
# - Orphans are normal for LEASE_SECONDS + one reconcile after a crash. Orphans seen in every
#   minute for five minutes mean nobody can take them (fleet at max, or acquisition broken).
ORPHANS_THRESHOLD = 1
ORPHANS_PERIODS = 5
# One repair is a bug in our code or a lost DynamoDB reply (worker/audit.py): worth a look at once.
LEASES_REPAIRED_THRESHOLD = 1
LEASES_REPAIRED_PERIODS = 1
# - The sink retries internally; errors in three consecutive minutes mean data is not flowing.
SINK_ERRORS_THRESHOLD = 1
SINK_ERRORS_PERIODS = 3
# - Any throttling on the table or a shared-partition GSI in two of three minutes.
THROTTLE_THRESHOLD = 1
THROTTLE_PERIODS = 3
THROTTLE_DATAPOINTS = 2
# - Any notification in the DLQ is a poison message worth a look (not an outage).
DLQ_THRESHOLD = 1
# - The fleet has gone silent: no worker reported ActiveConnections (every worker re-emits
#   the gauge on every flush, even at 0) in three periods in a row, or Container Insights
#   counts fewer running tasks than minTasks for three minutes. Missing data is breaching:
#   silence is exactly what these alarms are for.
SILENT_PERIODS = 3

# The alarms that roll a deployment back (ROLLBACK_ON_ALARM): a revision that cannot acquire
# or cannot keep its leases. Both treat missing data as not breaching, so a new, idle stack
# never rolls itself back. The silence alarms are not among them: on a stack's first create
# they are in ALARM until the first tasks report, which would roll the first deploy back.
DEPLOYMENT_ALARMS: tuple[str, ...] = ("LeaseAcquireFailuresAlarm", "LeasesLostOrSelfFencedAlarm")


def fill_sum(ids: Sequence[str]) -> str:
    """`FILL(a, 0) + FILL(b, 0) ...`: sparse counters have no datapoint in a quiet minute."""
    return " + ".join(f"FILL({i}, 0)" for i in ids)


class Observability(Construct):
    """An encrypted, TLS-only SNS topic CloudWatch may publish to, the alarms, a dashboard."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        namespace: str,
        table: dynamodb.ITable,
        index_names: Sequence[str],
        dead_letter_queue: sqs.IQueue,
        service: ecs.FargateService,
        min_tasks: int,
        metrics_seconds: int,
        stream: kinesis.IStream | None,
        alarm_email: str | None,
        retain: bool,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)

        # Who may use the key and the topic: CloudWatch alarms of this account and region
        # only (aws:SourceAccount / aws:SourceArn guard against the confused deputy).
        alarms_of_this_account = {
            "StringEquals": {"aws:SourceAccount": stack.account},
            "ArnLike": {
                "aws:SourceArn": stack.format_arn(
                    service="cloudwatch",
                    resource="alarm",
                    resource_name="*",
                    arn_format=ArnFormat.COLON_RESOURCE_NAME,
                )
            },
        }
        cloudwatch_principal = iam.ServicePrincipal("cloudwatch.amazonaws.com")

        # CloudWatch alarms cannot publish to a topic encrypted with the AWS-managed
        # aws/sns key (its key policy cannot be changed), so the topic has its own key.
        self.topic_key = kms.Key(
            self,
            "TopicKey",
            description="leaseworker alarm topic",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.RETAIN if retain else RemovalPolicy.DESTROY,
        )
        self.topic_key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowCloudWatchAlarmsToPublish",
                principals=[cloudwatch_principal],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],  # in a key policy, "*" means this key
                conditions=alarms_of_this_account,
            )
        )
        self.topic = sns.Topic(self, "AlarmTopic", master_key=self.topic_key, enforce_ssl=True)
        # enforce_ssl creates the topic policy with only a Deny, which replaces SNS's default
        # policy: without this Allow no alarm could publish (aws-solutions/automated-security-
        # response-on-aws#43).
        self.topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowCloudWatchAlarmsToPublish",
                principals=[cloudwatch_principal],
                actions=["sns:Publish"],
                resources=[self.topic.topic_arn],
                conditions=alarms_of_this_account,
            )
        )
        if alarm_email is not None:
            self.topic.add_subscription(subscriptions.EmailSubscription(alarm_email))
        action = cw_actions.SnsAction(self.topic)

        def metric(name: str, statistic: str = "Sum", period: Duration = PERIOD) -> cloudwatch.Metric:
            return metrics.worker_metric(name, namespace=namespace, statistic=statistic, period=period)

        self.alarms: dict[str, cloudwatch.Alarm] = {}

        def alarm(
            alarm_id: str,
            target: cloudwatch.IMetric,
            *,
            threshold: float,
            periods: int,
            datapoints: int | None = None,
            below: bool = False,
            description: str,
        ) -> None:
            created = cloudwatch.Alarm(
                self,
                alarm_id,
                metric=target,
                threshold=threshold,
                evaluation_periods=periods,
                datapoints_to_alarm=datapoints or periods,
                comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD
                if below
                else cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cloudwatch.TreatMissingData.BREACHING
                if below
                else cloudwatch.TreatMissingData.NOT_BREACHING,
                alarm_description=description,
            )
            created.add_alarm_action(action)
            created.add_ok_action(action)
            self.alarms[alarm_id] = created

        alarm(
            "LeaseAcquireFailuresAlarm",
            metric(metrics.LEASE_ACQUIRE_FAILURES),
            threshold=ACQUIRE_FAILURES_THRESHOLD,
            periods=ACQUIRE_FAILURES_PERIODS,
            description="Lease acquisitions fail with errors or throttles (not lost races).",
        )
        alarm(
            "LeasesLostOrSelfFencedAlarm",
            cloudwatch.MathExpression(
                expression=fill_sum(("lost", "fenced")),
                using_metrics={"lost": metric(metrics.LEASES_LOST), "fenced": metric(metrics.SELF_FENCED)},
                label="LeasesLost + SelfFenced",
                period=PERIOD,
            ),
            threshold=LOST_OR_FENCED_THRESHOLD,
            periods=1,
            description="A worker lost a lease or fenced itself: renewals are not landing in time.",
        )
        alarm(
            "OrphansPersistingAlarm",
            metric(metrics.ORPHANS_SEEN),
            threshold=ORPHANS_THRESHOLD,
            periods=ORPHANS_PERIODS,
            description="STARTED connections stay unowned: the fleet is at capacity or cannot acquire.",
        )
        alarm(
            "LeasesRepairedAlarm",
            metric(metrics.LEASES_REPAIRED),
            threshold=LEASES_REPAIRED_THRESHOLD,
            periods=LEASES_REPAIRED_PERIODS,
            description="The audit found a connection held but not served (or served but not held) "
            "and repaired it: a bug or a lost DynamoDB reply stranded it until then.",
        )
        alarm(
            "SinkErrorsAlarm",
            metric(metrics.SINK_ERRORS),
            threshold=SINK_ERRORS_THRESHOLD,
            periods=SINK_ERRORS_PERIODS,
            description="The sink keeps refusing records: delivery and checkpoints are stalled.",
        )
        # A period holds at least one flush of every worker (METRICS_SECONDS).
        silent_period = Duration.minutes(max(1, math.ceil(metrics_seconds / 60)))
        alarm(
            "FleetSilentAlarm",
            metric(metrics.ACTIVE_CONNECTIONS, "SampleCount", silent_period),
            threshold=1,
            periods=SILENT_PERIODS,
            below=True,
            description="No worker reports ActiveConnections: the fleet is down or cannot ship metrics.",
        )
        self.running_tasks = container_insights_metric("RunningTaskCount", service, "Minimum")
        alarm(
            "RunningTasksBelowMinimumAlarm",
            self.running_tasks,
            threshold=min_tasks,
            periods=SILENT_PERIODS,
            below=True,
            description=f"Fewer than minTasks ({min_tasks}) worker tasks are running.",
        )

        def table_metric(name: str, index: str | None) -> cloudwatch.Metric:
            dimensions = {"TableName": table.table_name}
            if index is not None:
                dimensions["GlobalSecondaryIndexName"] = index
            return cloudwatch.Metric(
                namespace="AWS/DynamoDB",
                metric_name=name,
                dimensions_map=dimensions,
                statistic="Sum",
                period=PERIOD,
            )

        throttles: dict[str, cloudwatch.IMetric] = {}
        for number, index in enumerate((None, *index_names)):
            throttles[f"r{number}"] = table_metric("ReadThrottleEvents", index)
            throttles[f"w{number}"] = table_metric("WriteThrottleEvents", index)
        alarm(
            "TableThrottlesAlarm",
            cloudwatch.MathExpression(
                expression=fill_sum(list(throttles)),
                using_metrics=throttles,
                label="Lease table + GSI throttle events",
                period=PERIOD,
            ),
            threshold=THROTTLE_THRESHOLD,
            periods=THROTTLE_PERIODS,
            datapoints=THROTTLE_DATAPOINTS,
            description="The lease table or a GSI throttles: renewals risk missing their deadline.",
        )
        alarm(
            "NotificationDeadLettersAlarm",
            dead_letter_queue.metric_approximate_number_of_messages_visible(
                period=PERIOD, statistic="Maximum"
            ),
            threshold=DLQ_THRESHOLD,
            periods=1,
            description="Notifications landed in the dead-letter queue.",
        )
        self.deployment_alarms = [self.alarms[name] for name in DEPLOYMENT_ALARMS]

        self.dashboard = build_dashboard(
            self,
            "Dashboard",
            alarms=list(self.alarms.values()),
            worker_metric=metric,
            table_metric=table_metric,
            index_names=index_names,
            container_insights=lambda name, statistic: container_insights_metric(name, service, statistic),
            stream=stream,
        )


def container_insights_metric(name: str, service: ecs.FargateService, statistic: str) -> cloudwatch.Metric:
    """A Container Insights service-level metric (namespace ECS/ContainerInsights)."""
    return cloudwatch.Metric(
        namespace="ECS/ContainerInsights",
        metric_name=name,
        dimensions_map={"ClusterName": service.cluster.cluster_name, "ServiceName": service.service_name},
        statistic=statistic,
        period=PERIOD,
    )
