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

    The GSI projects ALL attributes. The index is the worker's view of "what needs an
    owner", and projecting everything means any reader of it (the reconciler today asks only
    for connection_id; the CLI's listing and the session-mode free-connection search may
    want ws_url, lease_owner, lease_epoch, last_seq, failures) gets whole items without a
    GetItem per result and without a coordinated schema change here: an INCLUDE list that
    misses an attribute silently returns partial items, and a GSI projection cannot be
    changed in place (the index must be recreated). Items are small (< 1 KB), so storage is
    negligible. The cost, stated not hidden: every write that changes any attribute of an
    item in the index, checkpoints included, is also written to the index, on top of the
    sort-key rewrite per renewal (DESIGN.md §2a). KEYS_ONLY would avoid the checkpoint
    replication if that cost ever matters more than the flexibility.
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
