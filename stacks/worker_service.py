"""Network and the Fargate service that runs the workers, with the ADOT collector sidecar."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from aws_cdk import ArnFormat, CfnResource, Duration, RemovalPolicy, Size, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from stacks import nag
from stacks.config import VPC_MAX_AZS, CpuArchitecture

WORKER_CONTAINER = "worker"
COLLECTOR_CONTAINER = "otel-collector"

# The collector image (context collectorImage, pinned by digest: stacks.config.COLLECTOR_IMAGE)
# ships canned configs; ecs-xray.yaml receives OTLP on 0.0.0.0:4317 (gRPC) and 0.0.0.0:4318
# (HTTP) and exports to X-Ray (awsxray exporter), with ECS resource detection. The worker sends
# OTLP/HTTP to localhost:4318 (awsvpc: one netns).
COLLECTOR_CONFIG = "--config=/etc/ecs/ecs-xray.yaml"

# What the awsxray exporter calls. X-Ray does not support resource-level permissions for
# these actions, hence Resource "*" (acknowledged below).
XRAY_ACTIONS: tuple[str, ...] = (
    "xray:GetSamplingRules",
    "xray:GetSamplingTargets",
    "xray:PutTelemetryRecords",
    "xray:PutTraceSegments",
)

# The worker's writable scratch space: the root filesystem is read-only. The health file
# (/tmp/leaseworker/health.json, LEASEWORKER_HEALTH_FILE), Python's and OpenTelemetry's
# temporary files all live under /tmp, a task volume (Fargate ephemeral storage).
SCRATCH_VOLUME = "tmp"
SCRATCH_PATH = "/tmp"
HEALTH_COMMAND = ["CMD", "leaseworker", "health"]

# Rolling deployments replace about this share of the fleet per batch (see `max_healthy_percent`).
DEPLOYMENT_BATCH_PERCENT = 25

ARCHITECTURES: Mapping[CpuArchitecture, ecs.CpuArchitecture] = {
    "x86_64": ecs.CpuArchitecture.X86_64,
    "arm64": ecs.CpuArchitecture.ARM64,
}

# One socket per upstream connection plus SDK pools: 1000 connections need far more than
# the default 1024 descriptors.
NOFILE_LIMIT = 65536


@dataclass(frozen=True, slots=True)
class HealthCheckTiming:
    """The container health check, derived from the lease timings (all in seconds).

    `leaseworker health` passes only while heartbeats land. Checking every 2 heartbeats and
    failing after about one lease of failed checks marks a wedged worker unhealthy within
    roughly the time its leases take to expire anyway (its peers take them over), and ECS
    then replaces the task. The start period covers start-up up to the first heartbeat.
    ECS limits: interval 5..300, timeout 2..60, retries 1..10, start period 0..300.
    """

    interval: int
    timeout: int
    retries: int
    start_period: int

    @classmethod
    def derive(cls, *, heartbeat_seconds: int, lease_seconds: int) -> HealthCheckTiming:
        interval = min(300, max(5, 2 * heartbeat_seconds))
        return cls(
            interval=interval,
            timeout=min(60, max(2, interval // 2)),
            retries=min(10, max(1, math.ceil(lease_seconds / interval))),
            start_period=min(300, 2 * lease_seconds),
        )

    def health_check(self) -> ecs.HealthCheck:
        return ecs.HealthCheck(
            command=HEALTH_COMMAND,
            interval=Duration.seconds(self.interval),
            timeout=Duration.seconds(self.timeout),
            retries=self.retries,
            start_period=Duration.seconds(self.start_period),
        )


def max_healthy_percent(min_tasks: int) -> int:
    """The rolling deployment's ceiling, as a percentage of the desired count.

    ECS rounds desired x maximumPercent / 100 down, and minimumHealthyPercent stays at 100
    (a task is only stopped once its replacement runs). So a batch is floor(desired x
    (percent - 100) / 100) tasks, which must be at least 1 at the smallest fleet, minTasks,
    or the deployment cannot start a single new task. The percent is therefore
    100 + max(25, ceil(100 / minTasks)), capped at 200: with minTasks >= 4 a deployment
    replaces about a quarter of the fleet per batch; with minTasks = 1 (the default) the
    cap is 200 and a fleet scaled out beyond one task is replaced in one batch (each old
    task still hands its leases over on SIGTERM, docs/design.md §2c L2).
    """
    return min(200, 100 + max(DEPLOYMENT_BATCH_PERCENT, math.ceil(100 / min_tasks)))


class WorkerService(Construct):
    """VPC (private subnets, NAT egress, DynamoDB gateway endpoint, flow logs), cluster, task
    definition and service.

    Desired count is left to autoscaling (see `stacks.scaling`). Deployments are rolling:
    minimumHealthyPercent 100 and maximumPercent from `max_healthy_percent`, so new tasks
    start in batches and an old task stops only once a new one runs; each stopped task hands
    its leases over on SIGTERM. The circuit breaker and the deployment alarms (added by the
    stack with `enable_deployment_alarms`) roll a bad revision back.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        image: ecs.ContainerImage,
        collector_image: str,
        cpu_architecture: CpuArchitecture,
        environment: Mapping[str, str],
        cpu: int,
        memory_mib: int,
        stop_timeout: Duration,
        health_check: HealthCheckTiming,
        min_tasks: int,
        nat_gateways: int,
        log_retention: logs.RetentionDays,
        retain: bool,
    ) -> None:
        super().__init__(scope, construct_id)
        removal = RemovalPolicy.RETAIN if retain else RemovalPolicy.DESTROY

        # --- Network ---------------------------------------------------------------------
        flow_log_group = logs.LogGroup(self, "FlowLogs", retention=log_retention, removal_policy=removal)
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            max_azs=VPC_MAX_AZS,
            nat_gateways=nat_gateways,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                ec2.SubnetConfiguration(
                    name="workers", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=20
                ),
            ],
            flow_logs={
                "all": ec2.FlowLogOptions(
                    destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group),
                    traffic_type=ec2.FlowLogTrafficType.ALL,
                )
            },
        )

        # The VPC's default security group is stripped of all rules (the restrictDefault-
        # SecurityGroup feature flag) by a CDK-provided custom resource. Its handler carries a
        # DependsOn on its role that cfn-lint calls redundant (W3005): CDK's output, harmless.
        handler = (
            Stack.of(self)
            .node.find_child("Custom::VpcRestrictDefaultSGCustomResourceProvider")
            .node.find_child("Handler")
        )
        if isinstance(handler, CfnResource):
            handler.add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3005"]}})
            # Without a log group of its own the handler logs to an auto-created
            # /aws/lambda/... group that never expires.
            self.custom_resource_log_group = logs.LogGroup(
                self, "CustomResourceLogs", retention=log_retention, removal_policy=removal
            )
            handler.add_property_override(
                "LoggingConfig", {"LogGroup": self.custom_resource_log_group.log_group_name}
            )
            handler.node.add_dependency(self.custom_resource_log_group)

        # Renewals, reconciles and checkpoints reach DynamoDB through a gateway endpoint (free):
        # the lease path never depends on a NAT gateway, and costs no NAT data processing.
        private = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        self.dynamodb_endpoint = self.vpc.add_gateway_endpoint(
            "DynamoDbEndpoint", service=ec2.GatewayVpcEndpointAwsService.DYNAMODB, subnets=[private]
        )
        # ECR serves image layers from S3: through this (free) endpoint every task start's
        # layer download skips NAT data processing.
        self.s3_endpoint = self.vpc.add_gateway_endpoint(
            "S3Endpoint", service=ec2.GatewayVpcEndpointAwsService.S3, subnets=[private]
        )
        # No ingress at all; egress TCP only (upstream feeds use arbitrary ports; AWS APIs 443).
        # The VPC resolver and the task metadata endpoint are not subject to security groups.
        self.security_group = ec2.SecurityGroup(
            self,
            "ServiceSecurityGroup",
            vpc=self.vpc,
            allow_all_outbound=False,
            description="leaseworker tasks: no ingress, TCP egress to upstream feeds and AWS APIs",
        )
        self.security_group.add_egress_rule(
            ec2.Peer.any_ipv4(), ec2.Port.all_tcp(), "upstream feeds and AWS APIs (TCP only)"
        )

        # --- Cluster -----------------------------------------------------------------------
        self.cluster = ecs.Cluster(
            self, "Cluster", vpc=self.vpc, container_insights_v2=ecs.ContainerInsights.ENABLED
        )

        # --- Task definition ---------------------------------------------------------------
        self.log_group = logs.LogGroup(self, "Logs", retention=log_retention, removal_policy=removal)
        self.task_definition = ecs.FargateTaskDefinition(
            self,
            "TaskDefinition",
            cpu=cpu,
            memory_limit_mib=memory_mib,
            runtime_platform=ecs.RuntimePlatform(
                cpu_architecture=ARCHITECTURES[cpu_architecture],
                operating_system_family=ecs.OperatingSystemFamily.LINUX,
            ),
        )
        self.task_definition.add_volume(name=SCRATCH_VOLUME)
        # awslogs in non-blocking mode: a slow log pipeline must never stall the worker's
        # event loop (a stalled loop misses renewals and self-fences). The cost is that EMF
        # lines can be dropped if the 25 MiB buffer fills; metrics are best-effort, leases
        # are not.
        self.worker = self.task_definition.add_container(
            WORKER_CONTAINER,
            image=image,
            environment=dict(environment),
            essential=True,
            readonly_root_filesystem=True,
            health_check=health_check.health_check(),
            stop_timeout=stop_timeout,
            ulimits=[
                ecs.Ulimit(name=ecs.UlimitName.NOFILE, soft_limit=NOFILE_LIMIT, hard_limit=NOFILE_LIMIT)
            ],
            logging=ecs.LogDrivers.aws_logs(
                stream_prefix=WORKER_CONTAINER,
                log_group=self.log_group,
                mode=ecs.AwsLogDriverMode.NON_BLOCKING,
                max_buffer_size=Size.mebibytes(25),
            ),
        )
        self.worker.add_mount_points(
            ecs.MountPoint(container_path=SCRATCH_PATH, source_volume=SCRATCH_VOLUME, read_only=False)
        )
        # The collector is not essential: tracing is diagnostics. If it crashes, the worker
        # keeps its leases (the OTel exporter drops spans) instead of the whole task dying
        # and forcing up to MAX_CONNECTIONS handoffs. Its memory is capped so a leak cannot
        # starve the worker.
        self.collector = self.task_definition.add_container(
            COLLECTOR_CONTAINER,
            image=ecs.ContainerImage.from_registry(collector_image),
            command=[COLLECTOR_CONFIG],
            essential=False,
            memory_limit_mib=256,
            logging=ecs.LogDrivers.aws_logs(
                stream_prefix=COLLECTOR_CONTAINER,
                log_group=self.log_group,
                mode=ecs.AwsLogDriverMode.NON_BLOCKING,
                max_buffer_size=Size.mebibytes(4),
            ),
        )
        # The worker starts after the collector and, because ECS stops containers in reverse
        # dependency order, stops before it: the shutdown spans still reach X-Ray.
        self.worker.add_container_dependencies(
            ecs.ContainerDependency(
                container=self.collector, condition=ecs.ContainerDependencyCondition.START
            )
        )
        self.task_role = self.task_definition.task_role
        # Confused-deputy guard (AWS's guidance for ecs-tasks.amazonaws.com): only ECS acting for
        # this account, in this region, may assume the task role. The execution role keeps
        # CDK's plain trust: see docs/infrastructure.md (IAM).
        stack = Stack.of(self)
        task_role_resource = self.task_role.node.default_child
        assert isinstance(task_role_resource, iam.CfnRole)
        task_role_resource.add_property_override(
            "AssumeRolePolicyDocument.Statement.0.Condition",
            {
                "StringEquals": {"aws:SourceAccount": stack.account},
                "ArnLike": {
                    "aws:SourceArn": stack.format_arn(
                        service="ecs", resource="*", arn_format=ArnFormat.NO_RESOURCE_NAME
                    )
                },
            },
        )
        self.task_role.add_to_principal_policy(
            iam.PolicyStatement(sid="AdotXRayExport", actions=list(XRAY_ACTIONS), resources=["*"])
        )
        task_policy = self.task_definition.node.find_child("TaskRole").node.find_child("DefaultPolicy")
        nag.acknowledge(
            task_policy,
            "AwsSolutions-IAM5[Resource::*]",
            "X-Ray PutTraceSegments/PutTelemetryRecords/GetSampling* support no resource-level "
            "permissions; Resource * is the only valid value for the ADOT collector's export.",
        )
        nag.acknowledge(
            self.task_definition,
            "AwsSolutions-ECS2",
            "The environment holds only non-secret configuration (timings, resource names, the "
            "collector endpoint). AWS access comes from the task role, and upstream credentials are "
            "read at run time from Secrets Manager (upstreamSecrets), never put in the environment.",
        )
        execution_role = self.task_definition.obtain_execution_role()
        nag.acknowledge(
            execution_role.node.find_child("DefaultPolicy"),
            "AwsSolutions-IAM5[Resource::*]",
            "ecr:GetAuthorizationToken has no resource-level permissions; CDK grants it on * "
            "next to the repository-scoped image pull actions.",
        )

        # --- Service -----------------------------------------------------------------------
        self.service = ecs.FargateService(
            self,
            "Service",
            cluster=self.cluster,
            task_definition=self.task_definition,
            assign_public_ip=False,
            vpc_subnets=private,
            security_groups=[self.security_group],
            circuit_breaker=ecs.DeploymentCircuitBreaker(enable=True, rollback=True),
            min_healthy_percent=100,
            max_healthy_percent=max_healthy_percent(min_tasks),
            enable_execute_command=False,
            # Tasks carry the service's tags (project, stage): the main cost line is attributable.
            propagate_tags=ecs.PropagatedTagSource.SERVICE,
            enable_ecs_managed_tags=True,
        )
        # On a first create the tasks must find their routes: the private subnets' NAT default
        # routes (image pulls, upstream feeds) and the gateway endpoints (DynamoDB, S3) exist
        # before the service starts a task, so no pull failure counts toward the circuit breaker.
        self.service.node.add_dependency(
            self.vpc.select_subnets(
                subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS
            ).internet_connectivity_established,
            self.dynamodb_endpoint,
            self.s3_endpoint,
        )
