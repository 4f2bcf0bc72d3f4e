"""Network and the Fargate service that runs the workers, with the ADOT collector sidecar."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import CfnResource, Duration, RemovalPolicy, Size, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from stacks import nag
from stacks.config import VPC_MAX_AZS

WORKER_CONTAINER = "worker"
COLLECTOR_CONTAINER = "otel-collector"

# Pinned, never :latest. The image ships canned configs; ecs-xray.yaml receives OTLP on
# 0.0.0.0:4317 (gRPC) and 0.0.0.0:4318 (HTTP) and exports to X-Ray (awsxray exporter), with
# ECS resource detection. The worker sends OTLP/HTTP to localhost:4318 (awsvpc: one netns).
COLLECTOR_IMAGE = "public.ecr.aws/aws-observability/aws-otel-collector:v0.49.0"
COLLECTOR_CONFIG = "--config=/etc/ecs/ecs-xray.yaml"

# What the awsxray exporter calls. X-Ray does not support resource-level permissions for
# these actions, hence Resource "*" (acknowledged below).
XRAY_ACTIONS: tuple[str, ...] = (
    "xray:GetSamplingRules",
    "xray:GetSamplingTargets",
    "xray:PutTelemetryRecords",
    "xray:PutTraceSegments",
)

# One socket per upstream connection plus SDK pools: 1000 connections need far more than
# the default 1024 descriptors.
NOFILE_LIMIT = 65536


class WorkerService(Construct):
    """VPC (private subnets, NAT egress, flow logs), cluster, task definition and service.

    Desired count is left to autoscaling (see `stacks.scaling`); deployments replace tasks
    one batch at a time and each stopped task hands its leases over on SIGTERM.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        image: ecs.ContainerImage,
        environment: Mapping[str, str],
        cpu: int,
        memory_mib: int,
        stop_timeout: Duration,
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
                cpu_architecture=ecs.CpuArchitecture.X86_64,
                operating_system_family=ecs.OperatingSystemFamily.LINUX,
            ),
        )
        # awslogs in non-blocking mode: a slow log pipeline must never stall the worker's
        # event loop (a stalled loop misses renewals and self-fences). The cost is that EMF
        # lines can be dropped if the 25 MiB buffer fills; metrics are best-effort, leases
        # are not.
        self.worker = self.task_definition.add_container(
            WORKER_CONTAINER,
            image=image,
            environment=dict(environment),
            essential=True,
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
        # The collector is not essential: tracing is diagnostics. If it crashes, the worker
        # keeps its leases (the OTel exporter drops spans) instead of the whole task dying
        # and forcing up to MAX_CONNECTIONS handoffs. Its memory is capped so a leak cannot
        # starve the worker.
        self.collector = self.task_definition.add_container(
            COLLECTOR_CONTAINER,
            image=ecs.ContainerImage.from_registry(COLLECTOR_IMAGE),
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
            "collector endpoint). There are no secrets: AWS access comes from the task role.",
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
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            circuit_breaker=ecs.DeploymentCircuitBreaker(enable=True, rollback=True),
            min_healthy_percent=100,
            max_healthy_percent=200,
            enable_execute_command=False,
        )
