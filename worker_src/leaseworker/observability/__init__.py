"""Observability for the worker: JSON logs, EMF metrics and OpenTelemetry traces (docs/design.md §8)."""
