"""cdk-nag acknowledgements go through this one function.

Every acknowledgement names one finding and carries a reason; it is attached to the construct
it applies to. Routing them through a module attribute lets the infra tests remove one and
prove that the finding then surfaces (a nag test that cannot fail is a defect).
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, Validations
from constructs import IConstruct

MIN_REASON_LENGTH = 20


def acknowledge(scope: IConstruct, rule_id: str, reason: str) -> None:
    """Acknowledge one cdk-nag finding (e.g. `AwsSolutions-IAM5[Resource::*]`) on `scope`."""
    if len(reason.strip()) < MIN_REASON_LENGTH:
        raise ValueError(f"acknowledgement of {rule_id} needs a real reason, got {reason!r}")
    Validations.of(scope).acknowledge(Acknowledgment(id=rule_id, reason=reason))
