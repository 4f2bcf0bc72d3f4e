"""The CloudWatch dashboard: every §8 worker metric, the fleet, the table and the sink."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_kinesis as kinesis
from constructs import Construct

from stacks import metrics

PERIOD = Duration.minutes(1)
WorkerMetric = Callable[[str, str], cloudwatch.Metric]
TableMetric = Callable[[str, str | None], cloudwatch.Metric]
ContainerInsightsMetric = Callable[[str, str], cloudwatch.Metric]


def build_dashboard(
    scope: Construct,
    construct_id: str,
    *,
    alarms: Sequence[cloudwatch.Alarm],
    worker_metric: WorkerMetric,
    table_metric: TableMetric,
    index_names: Sequence[str],
    container_insights: ContainerInsightsMetric,
    stream: kinesis.IStream | None,
) -> cloudwatch.Dashboard:
    dashboard = cloudwatch.Dashboard(scope, construct_id, period_override=cloudwatch.PeriodOverride.AUTO)
    dashboard.add_widgets(cloudwatch.AlarmStatusWidget(title="Alarms", alarms=list(alarms), width=24))
    gauges = {metrics.ACTIVE_CONNECTIONS, metrics.CHECKPOINT_LAG_SEQ}
    durations = {metrics.TAKEOVER_SECONDS, metrics.HANDOFF_SECONDS, metrics.GAP_SECONDS}
    widgets: list[cloudwatch.IWidget] = []
    for name in metrics.ALL_METRICS:
        if name in gauges:
            shown = [worker_metric(name, "Average"), worker_metric(name, "Maximum")]
        elif name in durations:
            shown = [worker_metric(name, "p50"), worker_metric(name, "p99"), worker_metric(name, "Maximum")]
        else:
            shown = [worker_metric(name, "Sum")]
        widgets.append(cloudwatch.GraphWidget(title=name, left=shown, width=8, height=6))

    def graph(title: str, left: Sequence[cloudwatch.IMetric]) -> None:
        widgets.append(cloudwatch.GraphWidget(title=title, left=list(left), width=8, height=6))

    # The fleet, from Container Insights (ECS/ContainerInsights, per service).
    graph(
        "Tasks",
        [
            container_insights("RunningTaskCount", "Average"),
            container_insights("DesiredTaskCount", "Average"),
        ],
    )
    graph(
        "CPU (units)",
        [container_insights("CpuUtilized", "Average"), container_insights("CpuReserved", "Average")],
    )
    graph(
        "Memory (MiB)",
        [container_insights("MemoryUtilized", "Average"), container_insights("MemoryReserved", "Average")],
    )
    # The table and each GSI: renewals write through every index whose key they change.
    graph(
        "Lease table throttles",
        [table_metric("ReadThrottleEvents", None), table_metric("WriteThrottleEvents", None)],
    )
    graph("Index read throttles", [table_metric("ReadThrottleEvents", index) for index in index_names])
    graph("Index write throttles", [table_metric("WriteThrottleEvents", index) for index in index_names])
    if stream is not None:
        graph(
            "Kinesis throttled records",
            [
                stream.metric_put_records_throttled_records(period=PERIOD, statistic="Sum"),
                stream.metric_write_provisioned_throughput_exceeded(period=PERIOD, statistic="Sum"),
            ],
        )
    for row in range(0, len(widgets), 3):
        dashboard.add_widgets(*widgets[row : row + 3])
    return dashboard
