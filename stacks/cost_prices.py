"""List prices the cost model uses (docs/cost.md): one place, with the date and region they hold for.

On-demand list prices in us-east-1 (N. Virginia), read on 2026-12-05 from the AWS pricing pages
of each service (aws.amazon.com/<service>/pricing) and cross-checked against two independent
2026 summaries where the page did not show the figure. Other regions are typically 0-30 % higher;
the model prints a note when the stack's region is not this one. Free tiers are ignored (an
account's free allowances are shared by everything in it), except where noted.
"""

from __future__ import annotations

from dataclasses import dataclass

PRICES_DATE = "2026-12-05"
PRICES_REGION = "us-east-1"
HOURS_PER_MONTH = 730  # AWS's convention for a month
GIB = 1024**3


@dataclass(frozen=True, slots=True)
class FargatePrice:
    vcpu_hour: float
    gb_hour: float


FARGATE: dict[str, FargatePrice] = {
    "x86_64": FargatePrice(vcpu_hour=0.04048, gb_hour=0.004445),
    "arm64": FargatePrice(vcpu_hour=0.03238, gb_hour=0.00356),  # Graviton: 20 % less
}
NAT_HOUR = 0.045
NAT_GB = 0.045  # data processed, both directions
PUBLIC_IPV4_HOUR = 0.005  # each NAT gateway's Elastic IP
KINESIS_STREAM_HOUR = 0.04  # on-demand, per stream
KINESIS_IN_GB = 0.08  # each record rounded up to 1 KiB
KINESIS_OUT_GB = 0.04  # retrievals (one consumer reading everything once)
KINESIS_EXTENDED_GB_MONTH = 0.10  # retention beyond 24 h, up to 7 days
KINESIS_LONG_TERM_GB_MONTH = 0.023  # retention beyond 7 days (both modes)
KINESIS_SHARD_HOUR = 0.015  # provisioned (kinesisShards > 0)
KINESIS_PUT_UNIT_MILLION = 0.014  # provisioned: each record in 25 KB payload units
KINESIS_EXTENDED_SHARD_HOUR = 0.02  # provisioned: retention beyond 24 h, up to 7 days
# DynamoDB on-demand: the same prices as docs/benchmarks.md P4 (bench/model.py).
DYNAMODB_WRU = 0.625 / 1e6
DYNAMODB_RRU = 0.125 / 1e6
DYNAMODB_STORAGE_GB_MONTH = 0.25
DYNAMODB_PITR_GB_MONTH = 0.20
LOGS_INGEST_GB = 0.50  # also vended logs (VPC flow logs) in the first 10 TB
LOGS_STORAGE_GB_MONTH = 0.03
CUSTOM_METRIC_MONTH = 0.30  # EMF metrics and Container Insights metrics, first 10,000
ALARM_METRIC_MONTH = 0.10  # standard resolution, per metric an alarm reads
DASHBOARD_MONTH = 3.00  # beyond the account's first 3
KMS_KEY_MONTH = 1.00
SECRET_MONTH = 0.40
SECRET_API_10K = 0.05
SQS_REQUEST_MILLION = 0.40
XRAY_TRACE_MILLION = 5.00
ECR_STORAGE_GB_MONTH = 0.10
