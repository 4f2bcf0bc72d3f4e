"""Builds the app from a validated config: used by app.py and by the infra tests alike."""

from __future__ import annotations

from aws_cdk import App, Validations
from cdk_nag import AwsSolutionsChecks

from stacks.config import LeaseworkerConfig
from stacks.leaseworker_stack import LeaseworkerStack


def stack_name(config: LeaseworkerConfig) -> str:
    """One stack per stage, so dev and prod can share an account."""
    return f"Leaseworker-{config.stage}"


def build(app: App, config: LeaseworkerConfig) -> LeaseworkerStack:
    """Add the stack and the cdk-nag AwsSolutions validation plugin to `app`.

    cdk-nag 3.x runs as a policy-validation plugin (not an Aspect): findings that are not
    acknowledged make synth fail with a validation report.
    """
    stack = LeaseworkerStack(app, stack_name(config), config=config)
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return stack
