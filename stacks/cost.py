"""What the stack costs a month, itemised, for the same context the stack reads (docs/cost.md).

    python -m stacks.cost [-c key=value ...] [--connections 100,2000,10000]
                          [--msgs-per-second 0.1] [--message-bytes 300]

The context is cdk.json's plus cdk.context.json's plus the `-c` overrides, parsed by
`stacks.config.load_config` exactly as synth parses it (an invalid or unknown key is refused in
one line). Task counts follow the scaling policy; DynamoDB follows the measured per-operation
rates of docs/benchmarks.md (P3/P4, `bench.model`); prices are in `stacks.cost_prices`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import model
from stacks import cost_prices as p
from stacks.config import ConfigError, LeaseworkerConfig, load_config

REPO = Path(__file__).resolve().parent.parent
BENCH_RESULTS = REPO / "docs" / "bench" / "results.json"
SIZES = (100, 2000, 10000)

# Assumptions, each with its reason (docs/cost.md "What the model assumes").
ENVELOPE_BYTES = 190  # a SinkRecord's JSON around its data (measured: leaseworker.records)
WIRE_OVERHEAD = 1.10  # TLS, WebSocket and TCP framing on upstream bytes
BASE64 = 4 / 3  # PutRecords sends Data base64-encoded in JSON, through NAT
EMF_BYTES_PER_FLUSH = 2048  # one EMF document per task per metricsSeconds, every metric in it
LOG_BYTES_PER_CONNECTION_HOUR = 400  # about one INFO line (subscribe, reconnect) per hour
AWS_API_FLOWS_PER_TASK = 10  # Kinesis, SQS, Logs, X-Ray, ECR, DynamoDB connections per task
FLOW_RECORDS_PER_FLOW_HOUR = 36  # 6 records (task ENI in/out, NAT ENI 2 x in/out) per 10 min
FLOW_RECORD_BYTES = 120
INSIGHTS_METRICS = 30  # standard Container Insights: cluster, service and task-family metrics
INSIGHTS_BYTES_PER_TASK_MINUTE = 1024  # its performance log events
ALARMS, ALARM_METRICS = 9, 15  # stacks/observability.py (tests/infra/test_cost.py counts them)
IMAGE_GB = 0.2
RECEIVES_PER_TASK_HOUR = 180  # SQS long polls of 20 s
TRACES_PER_CONNECTION_HOUR = 1.0  # root spans (connect, takeover, handoff), before sampling
SECRET_READS_PER_CONNECTION_HOUR = 0.1  # a read per connect; reconnects are rare


DEFAULT_MSGS_PER_SECOND = 0.1  # per connection: a quiet feed; pass your own
DEFAULT_MESSAGE_BYTES = 300


@dataclass(frozen=True, slots=True)
class Workload:
    msgs_per_second: float = DEFAULT_MSGS_PER_SECOND  # per connection
    message_bytes: int = DEFAULT_MESSAGE_BYTES


@dataclass(frozen=True, slots=True)
class Line:
    service: str
    item: str
    dollars: float
    counted: bool = True  # False: an alternative, shown but not in the total


def tasks_for(config: LeaseworkerConfig, connections: int) -> int:
    """Where target tracking settles: the average per task near the target, within min..max."""
    wanted = math.ceil(connections / config.scale_target_connections)
    return min(config.max_tasks, max(config.min_tasks, wanted))


def fargate_month(config: LeaseworkerConfig, tasks: int, architecture: str) -> float:
    price = p.FARGATE[architecture]
    per_hour = config.task_cpu / 1024 * price.vcpu_hour + config.task_memory_mib / 1024 * price.gb_hour
    return tasks * per_hour * p.HOURS_PER_MONTH


def dynamodb_units(config: LeaseworkerConfig, connections: int, tasks: int) -> tuple[float, float]:
    """(WRU/s, RRU/s) from the measured per-kind rates of this lease mode, rescaled to the
    configured heartbeat, checkpoint and reconcile periods (the bench ran 5/5/5 s)."""
    result: dict[str, Any] = json.loads(BENCH_RESULTS.read_text())["designs"][config.lease_mode]
    measured = result["timings_real"]
    kinds: dict[str, Any] = {}
    for kind, info in result["kinds"].items():
        if kind.startswith("UpdateItem checkpoint") or "SET last_seq" in kind:
            factor = measured["checkpoint"] / config.checkpoint_seconds
        elif kind.startswith("Query by-state-expiry") and not kind.endswith("WORKER"):
            factor = measured["reconcile"] / config.reconcile_seconds
        else:
            factor = measured["heartbeat"] / config.heartbeat_seconds
        kinds[kind] = info | {"per_s_real": info["per_s_real"] * factor}
    totals = model.totals(result | {"kinds": kinds}, connections, tasks)
    return float(totals["wru_per_s"]), float(totals["rru_per_s"])


def _kinesis_lines(config: LeaseworkerConfig, records_per_s: float, record_bytes: int) -> list[Line]:
    seconds = p.HOURS_PER_MONTH * 3600
    billed_gb = records_per_s * math.ceil(record_bytes / 1024) * 1024 * seconds / p.GIB
    real_gb_per_hour = records_per_s * record_bytes * 3600 / p.GIB
    hours = config.stream_retention_hours
    long_term = real_gb_per_hour * max(0, hours - 168) * p.KINESIS_LONG_TERM_GB_MONTH
    shards = config.kinesis_shards
    if shards:
        units = records_per_s * math.ceil(record_bytes / 25600) * seconds
        extended = shards * p.KINESIS_EXTENDED_SHARD_HOUR * p.HOURS_PER_MONTH if hours > 24 else 0.0
        return [
            Line(
                "Kinesis", f"{shards} provisioned shard(s)", shards * p.KINESIS_SHARD_HOUR * p.HOURS_PER_MONTH
            ),
            Line("Kinesis", "PUT payload units (25 KB)", units / 1e6 * p.KINESIS_PUT_UNIT_MILLION),
            Line("Kinesis", "data out (one consumer, shared throughput)", 0.0),
            Line("Kinesis", f"retention beyond 24 h ({hours} h)", extended + long_term),
        ]
    extended = real_gb_per_hour * (min(hours, 168) - 24) * p.KINESIS_EXTENDED_GB_MONTH
    return [
        Line("Kinesis", "on-demand stream-hours", p.KINESIS_STREAM_HOUR * p.HOURS_PER_MONTH),
        Line("Kinesis", "data in (records rounded up to 1 KiB)", billed_gb * p.KINESIS_IN_GB),
        Line("Kinesis", "data out (one consumer)", billed_gb * p.KINESIS_OUT_GB),
        Line("Kinesis", f"retention beyond 24 h ({hours} h)", extended + long_term),
    ]


def monthly_lines(config: LeaseworkerConfig, connections: int, workload: Workload) -> list[Line]:
    """Every line of the monthly bill this stack causes at `connections` connections."""
    hours = p.HOURS_PER_MONTH
    tasks = tasks_for(config, connections)
    msgs_per_s = connections * workload.msgs_per_second
    record_bytes = workload.message_bytes + ENVELOPE_BYTES
    kinesis = config.sink == "kinesis"
    other = "arm64" if config.cpu_architecture == "x86_64" else "x86_64"
    size = f"tasks of {config.task_cpu / 1024:g} vCPU / {config.task_memory_mib / 1024:g} GB"
    lines = [
        Line(
            "Fargate",
            f"{size}, {config.cpu_architecture}",
            fargate_month(config, tasks, config.cpu_architecture),
        ),
        Line("Fargate", f"(the same on {other})", fargate_month(config, tasks, other), counted=False),
    ]
    nats = config.nat_gateway_count
    lines.append(
        Line("NAT", f"{nats} gateway(s) + Elastic IP", nats * (p.NAT_HOUR + p.PUBLIC_IPV4_HOUR) * hours)
    )

    log_gb = (
        (
            tasks * EMF_BYTES_PER_FLUSH * 3600 / config.metrics_seconds
            + connections * LOG_BYTES_PER_CONNECTION_HOUR
        )
        * hours
        / p.GIB
    )
    upstream_gb = msgs_per_s * workload.message_bytes * WIRE_OVERHEAD * 3600 * hours / p.GIB
    sink_gb = msgs_per_s * record_bytes * BASE64 * 3600 * hours / p.GIB if kinesis else 0.0
    lines.append(
        Line(
            "NAT",
            "data processed (feeds in, records and logs out)",
            (upstream_gb + sink_gb + log_gb) * p.NAT_GB,
        )
    )
    if kinesis:
        lines += _kinesis_lines(config, msgs_per_s, record_bytes)

    wru, rru = dynamodb_units(config, connections, tasks)
    seconds = hours * 3600
    lines.append(
        Line(
            "DynamoDB",
            f"coordination ({config.lease_mode} mode, P4 model)",
            (wru * p.DYNAMODB_WRU + rru * p.DYNAMODB_RRU) * seconds,
        )
    )
    table_gb = connections * 1024 / p.GIB
    lines.append(
        Line(
            "DynamoDB", "storage + PITR", table_gb * (p.DYNAMODB_STORAGE_GB_MONTH + p.DYNAMODB_PITR_GB_MONTH)
        )
    )

    retained_months = 12 if config.is_prod else 1
    lines.append(Line("CloudWatch", "logs: ingestion", log_gb * p.LOGS_INGEST_GB))
    lines.append(
        Line(
            "CloudWatch",
            f"logs: storage ({retained_months} month(s) kept)",
            log_gb * retained_months * p.LOGS_STORAGE_GB_MONTH,
        )
    )
    from stacks.metrics import ALL_METRICS  # imports aws_cdk: only when pricing

    lines.append(
        Line(
            "CloudWatch",
            f"custom metrics (EMF, {len(ALL_METRICS)})",
            len(ALL_METRICS) * p.CUSTOM_METRIC_MONTH,
        )
    )
    insights_gb = tasks * INSIGHTS_BYTES_PER_TASK_MINUTE * 60 * hours / p.GIB
    lines.append(
        Line(
            "CloudWatch",
            "Container Insights",
            INSIGHTS_METRICS * p.CUSTOM_METRIC_MONTH + insights_gb * p.LOGS_INGEST_GB,
        )
    )
    lines.append(
        Line(
            "CloudWatch",
            f"{ALARMS} alarms ({ALARM_METRICS} metrics) + dashboard",
            ALARM_METRICS * p.ALARM_METRIC_MONTH + p.DASHBOARD_MONTH,
        )
    )
    flows = connections + tasks * AWS_API_FLOWS_PER_TASK
    flow_gb = flows * FLOW_RECORDS_PER_FLOW_HOUR * FLOW_RECORD_BYTES * hours / p.GIB
    lines.append(
        Line(
            "VPC",
            "flow logs (ALL, to CloudWatch Logs)",
            flow_gb * (p.LOGS_INGEST_GB + retained_months * p.LOGS_STORAGE_GB_MONTH),
        )
    )
    lines.append(Line("KMS", "alarm topic key", p.KMS_KEY_MONTH))
    secrets = len(config.upstream_secrets)
    reads = connections * SECRET_READS_PER_CONNECTION_HOUR * hours if secrets else 0.0
    lines.append(
        Line(
            "Secrets Manager",
            f"{secrets} secret(s) + reads",
            secrets * p.SECRET_MONTH + reads / 1e4 * p.SECRET_API_10K,
        )
    )
    lines.append(
        Line(
            "SQS",
            "long polls and hints",
            tasks * RECEIVES_PER_TASK_HOUR * hours / 1e6 * p.SQS_REQUEST_MILLION,
        )
    )
    traces = connections * TRACES_PER_CONNECTION_HOUR * hours * config.trace_sample_ratio
    lines.append(
        Line("X-Ray", f"traces ({config.trace_sample_ratio:g} sampled)", traces / 1e6 * p.XRAY_TRACE_MILLION)
    )
    lines.append(Line("ECR", "worker image", IMAGE_GB * p.ECR_STORAGE_GB_MONTH))
    return lines


def total(lines: Sequence[Line]) -> float:
    return sum(line.dollars for line in lines if line.counted)


def render(config: LeaseworkerConfig, workload: Workload, sizes: Sequence[int]) -> str:
    """A markdown table: one row per line of the bill, one column per size; (x) = not counted."""
    columns = [monthly_lines(config, n, workload) for n in sizes]
    out = [
        "| service | item | " + " | ".join(f"{n:,} connections" for n in sizes) + " |",
        "|---|---|" + "---:|" * len(sizes),
    ]
    for index, line in enumerate(columns[0]):
        cells = [
            f"${c[index].dollars:,.2f}" if c[index].counted else f"(${c[index].dollars:,.2f})"
            for c in columns
        ]
        out.append(f"| {line.service} | {line.item} | " + " | ".join(cells) + " |")
    out.append("| **total** | | " + " | ".join(f"**${total(c):,.2f}**" for c in columns) + " |")
    tasks = ", ".join(f"{tasks_for(config, n)} at {n:,}" for n in sizes)
    out += ["", f"Tasks: {tasks}. Workload: {workload.msgs_per_second:g} msg/s per connection, "]
    out[-1] += f"{workload.message_bytes} B each."
    capacity = config.max_tasks * config.max_connections_per_task
    out += [
        f"- {n:,} connections do not fit: maxTasks x maxConnectionsPerTask = {capacity:,}."
        for n in sizes
        if n > capacity
    ]
    if config.region != p.PRICES_REGION:
        out.append(f"- Prices are {p.PRICES_REGION}'s; {config.region} is typically 0-30 % higher.")
    return "\n".join(out)


def context_from(overrides: Sequence[str]) -> dict[str, Any]:
    context: dict[str, Any] = json.loads((REPO / "cdk.json").read_text())["context"]
    context.update(json.loads((REPO / "cdk.context.json").read_text()))
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(item, item, "a context override must be key=value, as with cdk -c")
        context[key] = value
    return context


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="make cost", description="The stack's monthly cost, itemised (docs/cost.md)."
    )
    parser.add_argument(
        "-c", "--context", action="append", default=[], metavar="KEY=VALUE", help="as with cdk -c"
    )
    parser.add_argument(
        "--connections", default=",".join(str(n) for n in SIZES), help="comma-separated sizes"
    )
    parser.add_argument(
        "--msgs-per-second", type=float, default=DEFAULT_MSGS_PER_SECOND, help="per connection"
    )
    parser.add_argument("--message-bytes", type=int, default=DEFAULT_MESSAGE_BYTES)
    args = parser.parse_args(argv)
    try:
        sizes = tuple(int(n) for n in args.connections.split(","))
    except ValueError:
        parser.error(f"--connections {args.connections!r}: must be comma-separated integers")
    if any(n <= 0 for n in sizes) or args.msgs_per_second < 0 or args.message_bytes < 0:
        parser.error("sizes must be > 0; --msgs-per-second and --message-bytes >= 0")
    try:
        context = context_from(args.context)
        config = load_config(context.get, context.keys())
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 1
    workload = Workload(msgs_per_second=args.msgs_per_second, message_bytes=args.message_bytes)
    print(f"Leaseworker-{config.stage}, prices of {p.PRICES_DATE} ({p.PRICES_REGION}), $ per month:\n")
    print(render(config, workload, sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
