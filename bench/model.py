"""From the measured per-kind rates and prices: units per connection-hour, $/month, hot partitions.

Each kind scales with what it touches: a kind on connection items with the number of
connections N; a kind on session or checkpoint items, and every index query, with the number of
workers W. A checkpoint item's size grows with the entries it holds (N / W); a BatchGetItem of
session items reads W items. Prices are DynamoDB's rules (capacity.py), checked against
DynamoDB Local on the samples.
"""

from __future__ import annotations

import math
from typing import Any

WRU_DOLLARS = 0.625 / 1e6  # on-demand, us-east-1, as of 2026-12-03
RRU_DOLLARS = 0.125 / 1e6
PRICE_DATE = "2026-12-03"
SECONDS_PER_MONTH = 3600 * 24 * 30
PARTITION_WRU_CEILING = 1000.0  # per partition key, per second (DynamoDB's documented limit)
FLEET_SIZES = (100, 2000, 10000)


def workers_for(connections: int) -> int:
    """The fleet assumed for extrapolation: MAX_CONNECTIONS 1000 half used, at least 3 workers."""
    return max(3, math.ceil(connections / 500))


def _scales_with_connections(kind: str) -> bool:
    return " connection" in kind and not kind.startswith(("Query", "Scan", "BatchGetItem"))


def kind_rate(kind: str, info: dict[str, Any], measured: tuple[int, int], target: tuple[int, int]) -> float:
    (n0, w0), (n, w) = measured, target
    return float(info["per_s_real"]) * (n / n0 if _scales_with_connections(kind) else w / w0)


def kind_price(info: dict[str, Any], measured: tuple[int, int], target: tuple[int, int]) -> float:
    (_, w0), (n, w) = measured, target
    if "entries" in info:  # the checkpoint item: entries grow with connections per worker
        per_entry = (info["item_bytes"] - info["fixed_bytes"]) / max(1, info["entries"])
        table = max(1.0, float(math.ceil((info["fixed_bytes"] + per_entry * n / w) / 1024)))
        return table + float(sum(info.get("rules_indexes", {}).values()))
    if info.get("items") and str(info.get("kind", "")).startswith("BatchGetItem"):
        return float(info["rules"]) * w / w0
    return float(info.get("rules", 0.0))


def totals(result: dict[str, Any], connections: int, workers: int) -> dict[str, Any]:
    measured = (result["connections"], result["workers"])
    target = (connections, workers)
    wru = rru = 0.0
    partitions: dict[str, float] = {}
    for kind, info in result["kinds"].items():
        if "rules" not in info:
            continue
        priced = info | {"kind": kind}
        rate = kind_rate(kind, priced, measured, target)
        units = rate * kind_price(priced, measured, target)
        if info["write"]:
            wru += units
            for index, partition in info.get("partitions", {}).items():
                key = f"{index}/{partition}"
                partitions[key] = partitions.get(key, 0.0) + rate * info["rules_indexes"][index]
        else:
            rru += units
    hottest = max(partitions.items(), key=lambda p: p[1], default=("none", 0.0))
    return {
        "connections": connections,
        "workers": workers,
        "wru_per_s": wru,
        "rru_per_s": rru,
        "wru_per_connection_hour": wru / connections * 3600,
        "rru_per_connection_hour": rru / connections * 3600,
        "dollars_per_month": (wru * WRU_DOLLARS + rru * RRU_DOLLARS) * SECONDS_PER_MONTH,
        "hottest_index_partition": hottest[0],
        "hottest_index_partition_wru_per_s": hottest[1],
    }


def measured_totals(result: dict[str, Any]) -> dict[str, Any]:
    return totals(result, result["connections"], result["workers"])


def partition_ceiling(result: dict[str, Any]) -> float:
    """Connections at which the hottest index partition reaches 1,000 WRU/s (inf: never)."""
    at = measured_totals(result)
    per_connection = at["hottest_index_partition_wru_per_s"] / result["connections"]
    if per_connection <= 0 or not at["hottest_index_partition"].endswith("STARTED"):
        return math.inf
    return float(PARTITION_WRU_CEILING / per_connection)


def reads_per_worker_heartbeat(
    result: dict[str, Any], listing: dict[str, dict[str, Any]]
) -> dict[str, float]:
    """RRU one worker reads per heartbeat, with each count of connections present in `listing`."""
    heartbeat = result["timings_real"]["heartbeat"]
    out: dict[str, float] = {}
    for count, prices in listing.items():
        out[count] = sum(
            float(info["per_s_real"]) / result["workers"] * heartbeat * float(prices[kind]["rules"])
            for kind, info in result["kinds"].items()
            if kind in prices
        )
    return out
