"""Alarms, the alarm topic and the dashboard over the worker's metrics (DESIGN.md §8)."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from stacks import metrics

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
# - The sink retries internally; errors in three consecutive minutes mean data is not flowing.
SINK_ERRORS_THRESHOLD = 1
SINK_ERRORS_PERIODS = 3
# - Any throttling on the table or the shared-partition GSI in two of three minutes.
THROTTLE_THRESHOLD = 1
THROTTLE_PERIODS = 3
THROTTLE_DATAPOINTS = 2
# - Any notification in the DLQ is a poison message worth a look (not an outage).
DLQ_THRESHOLD = 1


class Observability(Construct):
    """An encrypted, TLS-only SNS topic (optional email), the alarms and a dashboard."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        namespace: str,
        table: dynamodb.ITable,
        index_name: str,
        dead_letter_queue: sqs.IQueue,
        alarm_email: str | None,
        retain: bool,
    ) -> None:
        super().__init__(scope, construct_id)

        # CloudWatch alarms cannot publish to a topic encrypted with the AWS-managed
        # aws/sns key (its key policy cannot be changed), so the topic has its own key that
        # lets the CloudWatch service principal use it.
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
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],  # in a key policy, "*" means this key
            )
        )
        self.topic = sns.Topic(self, "AlarmTopic", master_key=self.topic_key, enforce_ssl=True)
        if alarm_email is not None:
            self.topic.add_subscription(subscriptions.EmailSubscription(alarm_email))
        action = cw_actions.SnsAction(self.topic)

        def metric(name: str, statistic: str = "Sum") -> cloudwatch.Metric:
            return metrics.worker_metric(name, namespace=namespace, statistic=statistic, period=PERIOD)

        self.alarms: dict[str, cloudwatch.Alarm] = {}

        def alarm(
            alarm_id: str,
            target: cloudwatch.IMetric,
            *,
            threshold: float,
            periods: int,
            datapoints: int | None = None,
            description: str,
        ) -> None:
            created = cloudwatch.Alarm(
                self,
                alarm_id,
                metric=target,
                threshold=threshold,
                evaluation_periods=periods,
                datapoints_to_alarm=datapoints or periods,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
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
                expression="lost + fenced",
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
            "SinkErrorsAlarm",
            metric(metrics.SINK_ERRORS),
            threshold=SINK_ERRORS_THRESHOLD,
            periods=SINK_ERRORS_PERIODS,
            description="The sink keeps refusing records: delivery and checkpoints are stalled.",
        )

        def table_metric(name: str, *, index: bool) -> cloudwatch.Metric:
            dimensions = {"TableName": table.table_name}
            if index:
                dimensions["GlobalSecondaryIndexName"] = index_name
            return cloudwatch.Metric(
                namespace="AWS/DynamoDB",
                metric_name=name,
                dimensions_map=dimensions,
                statistic="Sum",
                period=PERIOD,
            )

        alarm(
            "TableThrottlesAlarm",
            cloudwatch.MathExpression(
                expression="FILL(tr, 0) + FILL(tw, 0) + FILL(ir, 0) + FILL(iw, 0)",
                using_metrics={
                    "tr": table_metric("ReadThrottleEvents", index=False),
                    "tw": table_metric("WriteThrottleEvents", index=False),
                    "ir": table_metric("ReadThrottleEvents", index=True),
                    "iw": table_metric("WriteThrottleEvents", index=True),
                },
                label="Lease table + by-state-expiry throttle events",
                period=PERIOD,
            ),
            threshold=THROTTLE_THRESHOLD,
            periods=THROTTLE_PERIODS,
            datapoints=THROTTLE_DATAPOINTS,
            description="The lease table or its GSI throttles: renewals risk missing their deadline.",
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

        # --- Dashboard: every §8 metric, plus the alarms -----------------------------------
        self.dashboard = cloudwatch.Dashboard(
            self, "Dashboard", period_override=cloudwatch.PeriodOverride.AUTO
        )
        self.dashboard.add_widgets(
            cloudwatch.AlarmStatusWidget(title="Alarms", alarms=list(self.alarms.values()), width=24)
        )
        gauges = {metrics.ACTIVE_CONNECTIONS, metrics.CHECKPOINT_LAG_SEQ}
        durations = {metrics.TAKEOVER_SECONDS, metrics.HANDOFF_SECONDS}
        widgets: list[cloudwatch.IWidget] = []
        for name in metrics.ALL_METRICS:
            if name in gauges:
                shown = [metric(name, "Average"), metric(name, "Maximum")]
            elif name in durations:
                shown = [metric(name, "p50"), metric(name, "p99"), metric(name, "Maximum")]
            else:
                shown = [metric(name)]
            widgets.append(cloudwatch.GraphWidget(title=name, left=shown, width=8, height=6))
        widgets.append(
            cloudwatch.GraphWidget(
                title="Lease table throttles",
                left=[
                    table_metric("ReadThrottleEvents", index=False),
                    table_metric("WriteThrottleEvents", index=False),
                    table_metric("WriteThrottleEvents", index=True),
                ],
                width=8,
                height=6,
            )
        )
        for row in range(0, len(widgets), 3):
            self.dashboard.add_widgets(*widgets[row : row + 3])
