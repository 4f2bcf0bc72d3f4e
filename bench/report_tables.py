"""The tables of docs/benchmarks.md from the `designs` part: P1-P4, P7 and the listing reads, each
figure beside the previous run's where one is kept (bench/previous.py)."""

from __future__ import annotations

import math
from typing import Any

from bench import previous
from bench.model import FLEET_SIZES


def fmt(value: Any, digits: int = 2) -> str:
    if isinstance(value, str):
        return value
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float) and math.isinf(value):
        return "never"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def ratio(value: float, base: float) -> str:
    if not base or not math.isfinite(base) or not math.isfinite(value):
        return "n/a"
    ratio = value / base
    return f"1/{1 / ratio:.0f}" if 0 < ratio < 0.5 else f"{ratio:.2f}"


def before(results: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The previous run's designs and its date ({} and "" when there is none)."""
    found = previous.of(results, "designs")
    if not found:
        return {}, ""
    return found["value"].get("designs", {}), str(found["date"])


def p3(designs: dict[str, Any], before: dict[str, Any] | None = None) -> list[str]:
    seed = designs.get("seed", {}).get("measured", {})
    conn = designs.get("connection", {}).get("measured", {})
    before = before or {}
    rows = [
        "| design | WRU/s | RRU/s | WRU per connection-hour | vs seed | vs connection "
        "| RRU per connection-hour | vs seed | WRU per connection-hour, previous run |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, result in designs.items():
        m = result["measured"]
        rows.append(
            f"| {name} | {fmt(m['wru_per_s'])} | {fmt(m['rru_per_s'])} | {fmt(m['wru_per_connection_hour'])} "
            f"| {ratio(m['wru_per_connection_hour'], seed.get('wru_per_connection_hour', 0))} "
            f"| {ratio(m['wru_per_connection_hour'], conn.get('wru_per_connection_hour', 0))} "
            f"| {fmt(m['rru_per_connection_hour'])} "
            f"| {ratio(m['rru_per_connection_hour'], seed.get('rru_per_connection_hour', 0))} "
            f"| {fmt(before.get(name, {}).get('measured', {}).get('wru_per_connection_hour', '—'))} |"
        )
    return rows


def kinds(designs: dict[str, Any]) -> list[str]:
    rows = [
        "| design | operation kind | count | per s (real) | units, rules | units, DynamoDB Local "
        "| index units (rules / Local) |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for name, result in designs.items():
        for kind, info in result["kinds"].items():
            indexes = (
                f"{info.get('rules_indexes', '')} / {info.get('local_indexes', '')}"
                if info.get("write")
                else ""
            )
            rows.append(
                f"| {name} | `{kind}` | {info['count']} | {fmt(info['per_s_real'], 3)} "
                f"| {fmt(info.get('rules'))} "
                f"| {fmt(info.get('local'))} | {indexes} |"
            )
    return rows


def p4(designs: dict[str, Any]) -> list[str]:
    head = " | ".join(f"{n:,} connections" for n in FLEET_SIZES)
    rows = [f"| design | {head} |", "|---|" + "---:|" * len(FLEET_SIZES)]
    for name, result in designs.items():
        cells = []
        for n in FLEET_SIZES:
            fleet = result["fleets"][str(n)]
            cells.append(f"${fmt(fleet['dollars_per_month'])} ({fleet['workers']} workers)")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    rows += ["", "Write units per connection-hour at those sizes (ratio to seed):", ""]
    rows += [f"| design | {head} |", "|---|" + "---:|" * len(FLEET_SIZES)]
    seed = designs.get("seed")
    for name, result in designs.items():
        cells = []
        for n in FLEET_SIZES:
            wru = result["fleets"][str(n)]["wru_per_connection_hour"]
            base = seed["fleets"][str(n)]["wru_per_connection_hour"] if seed else 0.0
            cells.append(f"{fmt(wru)} ({ratio(wru, base)})")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return rows


def failover(designs: dict[str, Any], before: dict[str, Any] | None = None) -> list[str]:
    seed = designs.get("seed", {})
    before = before or {}
    rows = [
        "| design | measure | n | p50 (s) | p99 (s) | max (s) | p99 vs seed | not resubscribed "
        "| p50 / p99 (s), previous run |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, label in (
        ("takeover_kill", "P1 takeover after SIGKILL"),
        ("handoff_term", "P2 handoff after SIGTERM"),
    ):
        for name, result in designs.items():
            s = result[key]
            if not s["n"]:
                continue
            measure = label
            if key == "takeover_kill":
                killed = result.get("kill", "group")
                measure += " of the " + (
                    "worker child (fence path)" if killed == "child" else "process group (lease path)"
                )
            base = seed.get(key, {}).get("p99", math.nan)
            p99 = s["p99"] if not isinstance(s["p99"], str) else math.nan
            rows.append(
                f"| {name} | {measure} | {s['n']} | {fmt(s['p50'])} | {fmt(s['p99'])} | {fmt(s['max'])} "
                f"| {ratio(p99, base if not isinstance(base, str) else math.nan)} | {s['missed']} "
                f"| {previous_pair(before.get(name, {}).get(key))} |"
            )
    return rows


def previous_pair(summary: dict[str, Any] | None) -> str:
    if not summary or not summary.get("n"):
        return "—"
    return f"{fmt(summary['p50'])} / {fmt(summary['p99'])}"


def p7(designs: dict[str, Any]) -> list[str]:
    rows = [
        "| design | hottest index partition (steady state) | its WRU/s at the run's size "
        "| per connection | 1,000 WRU/s reached at |",
        "|---|---|---:|---:|---:|",
    ]
    for name, result in designs.items():
        m = result["measured"]
        per = m["hottest_index_partition_wru_per_s"] / result["connections"]
        ceiling = result["partition_ceiling_connections"]
        finite = not isinstance(ceiling, str) and math.isfinite(ceiling)
        reached = f"{fmt(ceiling)} connections" if finite else "never (no steady index writes)"
        rows.append(
            f"| {name} | {m['hottest_index_partition']} "
            f"| {fmt(m['hottest_index_partition_wru_per_s'])} | {per:.3f} | {reached} |"
        )
    return rows


def listing(listing: dict[str, Any]) -> list[str]:
    if not listing:
        return ["(not measured: the session design did not run)"]
    rows = [
        "| connections present | read kind | items read | RRU, rules | RRU, DynamoDB Local |",
        "|---:|---|---:|---:|---:|",
    ]
    for count, prices in listing["prices"].items():
        for kind, info in prices.items():
            rows.append(
                f"| {count} | `{kind}` | {info.get('items', '')} | {fmt(info['rules'])} "
                f"| {fmt(info['local'])} |"
            )
    per = ", ".join(
        f"{fmt(v)} RRU with {k} connections" for k, v in listing["rru_per_worker_heartbeat"].items()
    )
    return [*rows, "", f"Reads per worker per heartbeat: {per}."]
