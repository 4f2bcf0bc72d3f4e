"""The lease table (docs/design.md §2): one item per connection, plus worker session items."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from constructs import Construct

from stacks.vocabulary import (
    INDEX_BY_OWNER,
    INDEX_BY_OWNER_PK,
    INDEX_BY_STATE_EXPIRY,
    INDEX_BY_STATE_EXPIRY_PK,
    INDEX_BY_STATE_EXPIRY_SK,
    TABLE_KEY,
    TTL_ATTRIBUTE,
)


class LeaseTable(Construct):
    """On-demand, PITR, encrypted, TTL on `purge_at`; two KEYS_ONLY GSIs.

    `by-state-expiry` finds STARTED connections whose lease expired; `by-owner` (sparse, PK
    `lease_owner`) lists what one worker holds.

    The GSI projects KEYS_ONLY, as `leaseworker table create` does locally. Every reader of
    the index needs only keys: reconcile asks for connection_id, and the fair-share view only
    counts items (Select=COUNT). With KEYS_ONLY a write that changes no index key (a
    checkpoint, a failure note) is not replicated to the index, so each checkpoint costs
    1 WCU instead of 2. What remains, stated not hidden: every renewal rewrites the index
    sort key (docs/design.md §2a), and all STARTED items share one index partition.
    """

    def __init__(self, scope: Construct, construct_id: str, *, retain: bool) -> None:
        super().__init__(scope, construct_id)
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=dynamodb.Attribute(name=TABLE_KEY, type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            time_to_live_attribute=TTL_ATTRIBUTE,
            deletion_protection=retain,
            removal_policy=RemovalPolicy.RETAIN if retain else RemovalPolicy.DESTROY,
        )
        self.table.add_global_secondary_index(
            index_name=INDEX_BY_STATE_EXPIRY,
            partition_key=dynamodb.Attribute(
                name=INDEX_BY_STATE_EXPIRY_PK, type=dynamodb.AttributeType.STRING
            ),
            sort_key=dynamodb.Attribute(name=INDEX_BY_STATE_EXPIRY_SK, type=dynamodb.AttributeType.NUMBER),
            projection_type=dynamodb.ProjectionType.KEYS_ONLY,
        )
        self.table.add_global_secondary_index(
            index_name=INDEX_BY_OWNER,
            partition_key=dynamodb.Attribute(name=INDEX_BY_OWNER_PK, type=dynamodb.AttributeType.STRING),
            projection_type=dynamodb.ProjectionType.KEYS_ONLY,
        )
