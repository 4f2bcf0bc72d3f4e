"""The worker's metric contract (docs/design.md §8) as CloudWatch metric objects.

The worker publishes with Powertools Metrics (EMF): the only dimension is the lowercase
`service` key that Powertools adds from POWERTOOLS_SERVICE_NAME. Every CDK metric (scaling,
alarms, dashboard) is built here so they all use exactly that dimension.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch

from stacks.config import SERVICE_NAME

ACTIVE_CONNECTIONS = "ActiveConnections"
LEASES_ACQUIRED = "LeasesAcquired"
LEASE_ACQUIRE_FAILURES = "LeaseAcquireFailures"
LEASE_CONTENTION = "LeaseContention"
LEASES_LOST = "LeasesLost"
SELF_FENCED = "SelfFenced"
ORPHANS_SEEN = "OrphansSeen"
TAKEOVER_SECONDS = "TakeoverSeconds"
HANDOFF_SECONDS = "HandoffSeconds"
MESSAGES_DELIVERED = "MessagesDelivered"
SINK_ERRORS = "SinkErrors"
RECONNECTS = "Reconnects"
PROTOCOL_ERRORS = "ProtocolErrors"
CHECKPOINT_LAG_SEQ = "CheckpointLagSeq"
TAKEOVERS_BY_FENCE = "TakeoversByFence"
TAKEOVERS_BY_EXPIRY = "TakeoversByExpiry"
REPLAYS_DROPPED = "ReplaysDropped"
LEASES_REPAIRED = "LeasesRepaired"
GAPS_MARKED = "GapsMarked"
GAP_SECONDS = "GapSeconds"
CONNECTS_DEFERRED = "ConnectsDeferred"
BUDGET_WAIT_SECONDS = "BudgetWaitSeconds"

# Every metric name of docs/design.md §8, in the order the dashboard shows them.
ALL_METRICS: tuple[str, ...] = (
    ACTIVE_CONNECTIONS,
    LEASES_ACQUIRED,
    LEASE_ACQUIRE_FAILURES,
    LEASE_CONTENTION,
    LEASES_LOST,
    SELF_FENCED,
    ORPHANS_SEEN,
    TAKEOVER_SECONDS,
    TAKEOVERS_BY_FENCE,
    TAKEOVERS_BY_EXPIRY,
    HANDOFF_SECONDS,
    MESSAGES_DELIVERED,
    SINK_ERRORS,
    RECONNECTS,
    PROTOCOL_ERRORS,
    REPLAYS_DROPPED,
    CHECKPOINT_LAG_SEQ,
    LEASES_REPAIRED,
    GAPS_MARKED,
    GAP_SECONDS,
    CONNECTS_DEFERRED,
    BUDGET_WAIT_SECONDS,
)

# The only dimension; must equal what Powertools emits.
SERVICE_DIMENSIONS: dict[str, str] = {"service": SERVICE_NAME}


def worker_metric(
    name: str,
    *,
    namespace: str,
    statistic: str = "Sum",
    period: Duration | None = None,
    label: str | None = None,
) -> cloudwatch.Metric:
    """One of the worker's EMF metrics, aggregated over the whole fleet."""
    if name not in ALL_METRICS:
        raise ValueError(f"{name!r} is not a worker metric (docs/design.md §8)")
    return cloudwatch.Metric(
        namespace=namespace,
        metric_name=name,
        dimensions_map=dict(SERVICE_DIMENSIONS),
        statistic=statistic,
        period=period or Duration.minutes(1),
        label=label,
    )
