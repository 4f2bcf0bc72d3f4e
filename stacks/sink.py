"""The durable sink (docs/design.md §5): an on-demand Kinesis Data Stream."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kinesis as kinesis
from constructs import Construct

# What the worker's `kinesis:<stream>` sink calls: batched PutRecords, nothing else (it
# retries partial failures itself and never describes the stream).
PRODUCER_ACTIONS: tuple[str, ...] = ("kinesis:PutRecords",)


class KinesisSink(Construct):
    """On-demand capacity by default (no shard math as the fleet scales), or `shards` provisioned
    shards (cheaper when the fleet's records stay well under 1,000/s per shard: docs/cost.md).
    Encrypted with aws/kinesis."""

    def __init__(
        self, scope: Construct, construct_id: str, *, retain: bool, retention_hours: int, shards: int
    ) -> None:
        super().__init__(scope, construct_id)
        self.stream = kinesis.Stream(
            self,
            "Stream",
            stream_mode=kinesis.StreamMode.PROVISIONED if shards else kinesis.StreamMode.ON_DEMAND,
            shard_count=shards or None,
            encryption=kinesis.StreamEncryption.MANAGED,
            retention_period=Duration.hours(retention_hours),
            removal_policy=RemovalPolicy.RETAIN if retain else RemovalPolicy.DESTROY,
        )

    def sink_spec(self) -> str:
        """The worker's SINK value (docs/design.md §5)."""
        return f"kinesis:{self.stream.stream_name}"

    def grant_produce(self, grantee: iam.IGrantable) -> iam.Grant:
        # The stream uses the AWS-managed key, so producers need no KMS permissions.
        return self.stream.grant(grantee, *PRODUCER_ACTIONS)
