"""Autoscaling: target tracking on the fleet-wide average of ActiveConnections per task."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_ecs as ecs
from constructs import Construct

from stacks import metrics


class WorkerScaling(Construct):
    """Keeps the average ActiveConnections per task near `target_connections_per_task`.

    Each worker emits its own ActiveConnections gauge under the single `service` dimension,
    so the Average over the fleet is total connections / tasks. This only converges because
    each worker caps its load at MAX_CONNECTIONS (the target is validated to be below it)
    and new tasks pick up orphans and rebalanced connections. Scale-in stops a task with
    SIGTERM, which hands its leases over at once (docs/design.md §2c L2).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        service: ecs.FargateService,
        namespace: str,
        min_tasks: int,
        max_tasks: int,
        target_connections_per_task: int,
        scale_in_cooldown: Duration,
        scale_out_cooldown: Duration,
    ) -> None:
        super().__init__(scope, construct_id)
        self.metric = metrics.worker_metric(
            metrics.ACTIVE_CONNECTIONS, namespace=namespace, statistic="Average"
        )
        self.task_count = service.auto_scale_task_count(min_capacity=min_tasks, max_capacity=max_tasks)
        self.task_count.scale_to_track_custom_metric(
            "ActiveConnectionsPerTask",
            metric=self.metric,
            target_value=target_connections_per_task,
            scale_in_cooldown=scale_in_cooldown,
            scale_out_cooldown=scale_out_cooldown,
        )
