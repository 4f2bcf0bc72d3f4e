"""The notification queue (docs/design.md §6): a fast path only, correctness never depends on it."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_sqs as sqs
from constructs import Construct

# A notification that failed this many receives is poison: park it for inspection.
MAX_RECEIVE_COUNT = 5


class NotificationQueue(Construct):
    """SQS queue (SSE-SQS, TLS only) with an encrypted, TLS-only dead-letter queue.

    Notifications go stale fast (the reconciler catches up within RECONCILE_SECONDS anyway),
    so retention is short.
    """

    def __init__(self, scope: Construct, construct_id: str, *, retain: bool) -> None:
        super().__init__(scope, construct_id)
        removal = RemovalPolicy.RETAIN if retain else RemovalPolicy.DESTROY
        self.dead_letter_queue = sqs.Queue(
            self,
            "DeadLetterQueue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
            removal_policy=removal,
        )
        self.queue = sqs.Queue(
            self,
            "Queue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.hours(1),
            visibility_timeout=Duration.seconds(30),
            dead_letter_queue=sqs.DeadLetterQueue(
                queue=self.dead_letter_queue, max_receive_count=MAX_RECEIVE_COUNT
            ),
            removal_policy=removal,
        )
