"""Observability for the worker: JSON logs, EMF metrics and OpenTelemetry traces (DESIGN.md §8)."""
