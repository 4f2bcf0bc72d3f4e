"""Presets and local feed replays (DESIGN.md §4.2 "Presets")."""
