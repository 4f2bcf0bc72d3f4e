"""The lease table (DESIGN.md §2): one item per connection, plus worker session items."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from constructs import Construct

PARTITION_KEY = "connection_id"
STATE_EXPIRY_INDEX = "by-state-expiry"
STATE_EXPIRY_INDEX_PK = "desired_state"
STATE_EXPIRY_INDEX_SK = "lease_expires_at_ms"


class LeaseTable(Construct):
    """On-demand, PITR, encrypted; `by-state-expiry` finds STARTED connections whose lease expired.

    The GSI projects KEYS_ONLY, as `leaseworker table create` does locally. Every reader of
    the index needs only keys: reconcile asks for connection_id, and the fair-share view only
    counts items (Select=COUNT). With KEYS_ONLY a write that changes no index key (a
    checkpoint, a failure note) is not replicated to the index, so each checkpoint costs
    1 WCU instead of 2. What remains, stated not hidden: every renewal rewrites the index
    sort key (DESIGN.md §2a), and all STARTED items share one index partition.
    """

    def __init__(self, scope: Construct, construct_id: str, *, retain: bool) -> None:
        super().__init__(scope, construct_id)
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=dynamodb.Attribute(name=PARTITION_KEY, type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            deletion_protection=retain,
            removal_policy=RemovalPolicy.RETAIN if retain else RemovalPolicy.DESTROY,
        )
        self.table.add_global_secondary_index(
            index_name=STATE_EXPIRY_INDEX,
            partition_key=dynamodb.Attribute(name=STATE_EXPIRY_INDEX_PK, type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name=STATE_EXPIRY_INDEX_SK, type=dynamodb.AttributeType.NUMBER),
            projection_type=dynamodb.ProjectionType.KEYS_ONLY,
        )
