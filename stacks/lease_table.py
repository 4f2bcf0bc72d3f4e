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

    The GSI projects ALL attributes. The reconciler acts on what the query returns (ws_url,
    last_seq, lease_epoch, lease_owner, failures) without a GetItem per orphan, and the
    worker team can read any §2 attribute from index results without a coordinated schema
    change here: an INCLUDE list that misses one silently returns partial items. Items are
    small (< 1 KB), so the extra index storage is negligible. The cost, stated not hidden:
    every write that changes any attribute of an item in the index (checkpoints included)
    is replicated to the index, on top of the sort-key rewrite per renewal (DESIGN.md §2a).
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
            projection_type=dynamodb.ProjectionType.ALL,
        )
