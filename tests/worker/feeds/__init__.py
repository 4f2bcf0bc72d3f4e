"""Presets and local feed replays (docs/design.md §4.2 "Presets")."""
