"""The leaseworker CDK application: one stack composing one construct per concern."""
