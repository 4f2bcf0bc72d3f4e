"""The worker image's supply: the base pinned by digest, nothing else pulled, the health check aligned."""

from __future__ import annotations

import re

from stacks.config import COLLECTOR_IMAGE, DIGEST_PINNED_IMAGE, LeaseworkerConfig
from stacks.worker_service import HealthCheckTiming
from tests.infra.conftest import REPO

DOCKERFILE = (REPO / "worker_src" / "Dockerfile").read_text()


def test_base_image_pinned_by_tag_and_index_digest() -> None:
    (base,) = re.findall(r"^FROM\s+(\S+)", DOCKERFILE, flags=re.MULTILINE)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", base), base


def test_no_frontend_image_is_pulled() -> None:
    """A `# syntax=` line makes BuildKit pull a frontend image from Docker Hub on every build."""
    assert not re.search(r"^#\s*syntax\s*=", DOCKERFILE, flags=re.MULTILINE | re.IGNORECASE)


def test_collector_default_is_digest_pinned() -> None:
    assert DIGEST_PINNED_IMAGE.fullmatch(COLLECTOR_IMAGE)
    assert COLLECTOR_IMAGE.startswith("public.ecr.aws/aws-observability/aws-otel-collector:v")


def test_image_healthcheck_matches_the_task_definitions_default() -> None:
    config = LeaseworkerConfig()
    timing = HealthCheckTiming.derive(
        heartbeat_seconds=config.heartbeat_seconds, lease_seconds=config.lease_seconds
    )
    (line,) = [line for line in DOCKERFILE.splitlines() if line.startswith("HEALTHCHECK")]
    assert f"--interval={timing.interval}s" in line
    assert f"--timeout={timing.timeout}s" in line
    assert f"--start-period={timing.start_period}s" in line
    assert f"--retries={timing.retries}" in line


def test_only_the_installed_package_remains_in_the_workdir() -> None:
    """`python -m leaseworker...` runs from /app: a source copy there would shadow the install."""
    assert re.search(r"rm -rf [^\n]*/app/leaseworker", DOCKERFILE)
