"""Markdown for P5 (process capacity) and P6 (cold start): tables, then each target met or missed."""

from __future__ import annotations

from typing import Any

from bench.process_capacity import (
    TARGET_CONNECTIONS,
    TARGET_KB_PER_CONNECTION,
    TARGET_MSGS_PER_CORE,
)


def _n(value: float) -> str:
    return f"{value:,.0f}"


def _kb(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _verdict(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def _p5_previous(previous: dict[str, Any] | None) -> dict[tuple[str, int, float], float]:
    if not previous:
        return {}
    return {
        (sink, step["connections"], step["offered_msgs_per_s"] / step["connections"]): step["msgs_per_cpu_s"]
        for sink, ramp in previous["value"]["sinks"].items()
        for step in [*ramp["steps"], ramp["dense"]]
    }


def p5_section(results: dict[str, Any], previous: dict[str, Any] | None = None) -> list[str]:
    """`previous`: the previous run's {"date", "value"} (its msgs/s per core go in the last column)."""
    config = results["config"]
    lines = [
        "## P5: one worker process (connections, msgs/s per core, RSS per connection)",
        "",
        f"One `leaseworker run` (supervisor + worker child), {results['lease_mode']} mode, "
        f"ramped at {config['rate']:g} msg/s per connection on the local feed, then (a fresh fleet) "
        f"{config['dense_connections']:,} connections at {config['dense_rate']:g} msg/s; steady window "
        f"{config['window_s']:g} s per step. msgs/s per core = messages delivered / the worker child's "
        "CPU seconds (utime + stime); the feed and DynamoDB Local share the 2 cores.",
        "",
        "| sink | connections × msg/s | held | worker RSS (MB) | KB/conn (total) | KB/conn (marginal) "
        "| msgs/s offered | msgs/s wall | worker cores | msgs/s per core | feed cores | bottleneck "
        "| msgs/s per core, previous run |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    before = _p5_previous(previous)
    for sink, ramp in results["sinks"].items():
        for step in [*ramp["steps"], ramp["dense"]]:
            rate = step["offered_msgs_per_s"] / step["connections"]
            lines.append(
                f"| {sink} | {_n(step['connections'])} × {rate:g}/s | {_n(step['held_feed'])} "
                f"| {step['rss_bytes'] / 2**20:.1f} | {_kb(step['kb_per_connection'])} "
                f"| {_kb(step['marginal_kb_per_connection'])} | {_n(step['offered_msgs_per_s'])} "
                f"| {_n(step['msgs_per_s_wall'])} | {step['cores']['worker']:.2f} "
                f"| {_n(step['msgs_per_cpu_s'])} | {step['cores']['feed']:.2f} | {step['bottleneck']} "
                f"| {_n(before[key]) if (key := (sink, step['connections'], rate)) in before else '—'} |"
            )
    lines.append("")
    for sink, ramp in results["sinks"].items():
        lines.append(
            f"- {sink} sink: worker RSS at 0 connections {ramp['baseline_rss_bytes'] / 2**20:.1f} MB; "
            f"supervisor RSS {ramp['supervisor_rss_bytes'] / 2**20:.1f} MB (not in the table)."
        )
    if previous:
        lines.append(f"- Previous run: {previous['date']}.")
    lines += ["", *p5_targets(results)]
    return lines


def p5_targets(results: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    ramps = results["sinks"]
    top = min(max(s["connections"] for s in ramp["steps"]) for ramp in ramps.values())
    held = min(
        max((s["held_feed"] for s in ramp["steps"] if s["connections"] == top), default=0)
        for ramp in ramps.values()
    )
    at_top = [s for ramp in ramps.values() for s in ramp["steps"] if s["connections"] == top]
    marginal = max(s["marginal_kb_per_connection"] or 0.0 for s in at_top)
    total = max(s["kb_per_connection"] or 0.0 for s in at_top)
    ok = held >= TARGET_CONNECTIONS and marginal <= TARGET_KB_PER_CONNECTION
    lines.append(
        f"- >= {_n(TARGET_CONNECTIONS)} connections per process at <= {TARGET_KB_PER_CONNECTION:g} KB RSS "
        f"each: {_n(held)} held at {marginal:.1f} KB marginal ({total:.1f} KB total RSS / connections): "
        + (_verdict(ok) if top >= TARGET_CONNECTIONS else f"not reached in this mode (top step {_n(top)})")
        + "."
    )
    for sink, ramp in ramps.items():
        for regime, steps in (("dense", [ramp["dense"]]), ("sparse (the ramp)", ramp["steps"])):
            best = max(steps, key=lambda s: s["msgs_per_cpu_s"])
            ok = best["msgs_per_cpu_s"] >= TARGET_MSGS_PER_CORE
            rate = best["offered_msgs_per_s"] / best["connections"]
            lines.append(
                f"- >= {_n(TARGET_MSGS_PER_CORE)} msgs/s per core, {sink} sink, {regime}: "
                f"{_n(best['msgs_per_cpu_s'])} at {_n(best['connections'])} × {rate:g} msg/s "
                f"({_n(best['msgs_per_s_wall'])} msgs/s wall on {best['cores']['worker']:.2f} worker cores): "
                f"{_verdict(ok)}."
            )
    return lines


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def p6_section(results: dict[str, Any], previous: dict[str, Any] | None = None) -> list[str]:
    """`previous`: the previous run's {"date", "value"} (its "all at once" goes in the last column)."""
    ceiling = results["ceiling_writes_per_s"]
    lines = [
        f"## P6: cold start of {_n(results['config']['connections'])} new connections",
        "",
        "Workers started together at production timings (lease 20 s, heartbeat 5 s, reconcile 5 s); "
        "seconds from the first worker's start until the feed saw each connection subscribed. "
        f"Ideal: one conditional write per claim at DynamoDB Local's ~{ceiling:g}/s.",
        "",
        "| mode | workers | MAX_CONNECTIONS | to own | ids subscribed | most at once | subscribes "
        "| first (s) | p50 (s) | p90 (s) | all at once (s) | claims/s | claims/s after the first "
        "| ideal (s) | vs ideal | all at once (s), previous run |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    before = {
        (row["lease_mode"], row["workers"]): row["all_s"]
        for row in (previous or {}).get("value", {}).get("rows", [])
    }
    for row in results["rows"]:
        rate, after, ratio = row["claims_per_s"], row["claims_per_s_after_first"], row["vs_ideal"]
        lines.append(
            f"| {row['lease_mode']} | {row['workers']} | {_n(row['max_connections'])} "
            f"| {_n(row['expected_owned'])} | {_n(row['subscribed'])} | {_n(row.get('most_open', 0))} "
            f"| {_n(row.get('subscribes', 0))} | {_s(row['first_subscribe_s'])} "
            f"| {_s(row['p50_s'])} | {_s(row['p90_s'])} | {_s(row['all_s'])} "
            f"| {'—' if rate is None else _n(rate)} | {'—' if after is None else _n(after)} "
            f"| {row['ideal_s']:.1f} | {'—' if ratio is None else f'{ratio:.2f}x'} "
            f"| {_s(before.get((row['lease_mode'], row['workers'])))} |"
        )
    lines.append("")
    for row in results["rows"]:
        short = row["expected_owned"] < row["connections"]
        what = f"{row['lease_mode']} mode, {row['workers']} workers: " + (
            f"all {_n(row['expected_owned'])} subscribed in {_s(row['all_s'])} s, "
            f"{_n(row['claims_per_s'])} claims/s = {row['claims_per_s'] / ceiling:.0%} of {ceiling:g}/s"
            if row["all_subscribed"]
            else f"never all {_n(row['expected_owned'])} at once before the timeout (at most "
            f"{_n(row.get('most_open', 0))}; {_n(row.get('subscribes', 0))} subscribes of "
            f"{_n(row['subscribed'])} ids: leases lost and claimed again)"
        )
        if short:
            what += (
                f"; {_n(row['connections'] - row['expected_owned'])} stay free: session mode caps "
                f"MAX_CONNECTIONS at {_n(row['max_connections'])} (one checkpoint item)"
            )
        lines.append(f"- {what}.")
    if previous:
        lines.append(f"- Previous run: {previous['date']}.")
    return lines
