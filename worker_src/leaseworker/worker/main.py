"""`leaseworker run`: wire the settings into clients, sink, telemetry and the Worker, then run it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, TextIO

import aioboto3

from leaseworker import early_stop
from leaseworker.aws import dynamodb_client, sqs_client
from leaseworker.health import HealthFile
from leaseworker.lease.absent_owners import AbsentOwnerStore
from leaseworker.lease.budget_store import BudgetStore
from leaseworker.lease.checkpoint_store import CheckpointStore
from leaseworker.lease.connection_store import ConnectionStore
from leaseworker.lease.held_store import SessionHeldStore
from leaseworker.lease.liveness import SessionValidity
from leaseworker.lease.ownership import ConnectionLeases, Ownership
from leaseworker.lease.session_leases import SessionLeases
from leaseworker.lease.session_store import SessionStore
from leaseworker.notify import Hint, Notifier, notifications
from leaseworker.observability.logging import configure_logging, get_logger
from leaseworker.observability.metrics import DEFAULT_NAMESPACE, WorkerMetrics
from leaseworker.observability.tracing import configure_tracing
from leaseworker.secrets import ReferenceResolver, secrets_client
from leaseworker.settings import Settings
from leaseworker.sinks.base import Sink
from leaseworker.sinks.factory import open_sink
from leaseworker.worker.app import Coordination, Worker
from leaseworker.worker.budget import ConnectBudgets
from leaseworker.worker.ecs import ecs_task_arn
from leaseworker.worker.session_deps import SessionDeps
from leaseworker.worker.start_check import check_lease_table

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb import DynamoDBClient

logger = get_logger(__name__)

TEARDOWN_SLACK_SECONDS = 0.5


async def build_worker(
    settings: Settings,
    stack: AsyncExitStack,
    *,
    metrics_stream: TextIO | None = None,
    sink: Sink | None = None,
    wrap_dynamodb: Callable[[DynamoDBClient], DynamoDBClient] | None = None,
    check_table: bool = False,
) -> tuple[Worker, WorkerMetrics]:
    """Open every client once, in `stack`, and assemble the worker from them.

    `sink` replaces the one SINK names (tests inject faulty sinks this way); `wrap_dynamodb`
    wraps the lease client (tests inject lost replies this way). `check_table` first proves the
    lease table usable, or raises StartRefused within START_CHECK_SECONDS (worker/start_check.py)."""
    session = aioboto3.Session()
    ddb = await dynamodb_client(stack, session, settings)
    if check_table:
        await check_lease_table(ddb, settings)
    if wrap_dynamodb is not None:
        ddb = wrap_dynamodb(ddb)
    sink = sink or await open_sink(
        settings.sink,
        worker_id=settings.worker_id,
        stack=stack,
        session=session,
        endpoint_url=None,  # botocore resolves AWS_ENDPOINT_URL_KINESIS / AWS_ENDPOINT_URL
        region=settings.region,
        # A sink write may not outlive a lease: past that another epoch may be delivering.
        kinesis_deadline_seconds=settings.local_validity_seconds,
    )
    notifier = Notifier(None, None)
    source = None
    if settings.notify_queue_url:
        sqs = await sqs_client(stack, session, settings)
        queue_url = settings.notify_queue_url
        notifier = Notifier(sqs, queue_url)

        def source(stop_event: asyncio.Event) -> AsyncIterator[Hint]:
            return notifications(sqs, queue_url, stop=stop_event)

    metrics = WorkerMetrics(
        namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or DEFAULT_NAMESPACE, stream=metrics_stream
    )
    tracing = configure_tracing(settings.otel_endpoint)
    stack.push_async_callback(asyncio.to_thread, tracing.shutdown)
    deps = SessionDeps(
        settings=settings,
        sink=sink,
        metrics=metrics,
        tracing=tracing,
        references=ReferenceResolver(_LazySecretsClient(stack, session, settings)),
        budgets=ConnectBudgets(BudgetStore(ddb, settings.table_name), metrics),
    )
    health = HealthFile.from_env()  # what `leaseworker health` (the container's check) reads
    worker = Worker(
        coordination=coordination(ddb, settings),
        deps=deps,
        notifier=notifier,
        notifications=source,
        task_arn=await ecs_task_arn(),
        on_heartbeat=lambda: health.beat(
            worker_id=settings.worker_id,
            heartbeat_seconds=settings.heartbeat_seconds,
            lease_seconds=settings.lease_seconds,
        ),
        on_stopping=health.stopping,
    )
    return worker, metrics


class _LazySecretsClient:
    """Opens the Secrets Manager client on the first `{{secret:…}}` a connection uses, so a
    worker whose feeds need none never builds one (nor needs a region or credentials for it)."""

    def __init__(self, stack: AsyncExitStack, session: aioboto3.Session, settings: Settings) -> None:
        self._stack, self._session, self._settings = stack, session, settings
        self._client: Any = None
        self._opening = asyncio.Lock()

    async def get_secret_value(self, *, SecretId: str) -> Mapping[str, object]:
        async with self._opening:
            if self._client is None:
                self._client = await secrets_client(self._stack, self._session, self._settings)
        response: Mapping[str, object] = await self._client.get_secret_value(SecretId=SecretId)
        return response


def coordination(ddb: DynamoDBClient, settings: Settings) -> Coordination:
    """One store per item kind, composed into the lease mode this worker holds by."""
    leases = ConnectionStore(ddb, settings)
    held = SessionHeldStore(ddb, settings)
    checkpoints = CheckpointStore(ddb, settings.table_name)
    validity = SessionValidity(settings)
    ownership: Ownership
    if settings.lease_mode == "session":
        ownership = SessionLeases(leases, held, checkpoints, validity, settings)
    else:
        ownership = ConnectionLeases(leases, held, settings)
    return Coordination(
        ownership=ownership,
        leases=leases,
        sessions=SessionStore(ddb, settings.table_name),
        held=held,
        checkpoints=checkpoints,
        validity=validity,
        absent=AbsentOwnerStore(ddb, settings.table_name),
    )


async def run_worker(settings: Settings) -> None:
    """Run until SIGTERM/SIGINT, then shut down, tear down and return within the grace period.

    The worker's ordered shutdown has SHUTDOWN_GRACE_SECONDS − SHUTDOWN_MARGIN_SECONDS; client
    and tracing teardown then get what is left of the grace period, less TEARDOWN_SLACK_SECONDS
    for the interpreter to exit, and are abandoned past it (ECS would SIGKILL us anyway).
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in early_stop.STOP_SIGNALS:  # the same signals the child held while importing
        loop.add_signal_handler(signum, stop.set)  # the handler only sets an Event
    configure_logging(os.environ.get("LOG_LEVEL", "INFO"))
    if early_stop.requested():  # while the child was importing this (early_stop.py): nothing to hand over
        logger.info("stop signal received during start-up; exiting before starting")
        return
    try:
        async with asyncio.timeout(None) as deadline:
            async with AsyncExitStack() as stack:
                worker, _ = await build_worker(settings, stack, check_table=True)
                armed = asyncio.create_task(_arm_deadline(stop, deadline, settings))
                try:
                    await worker.run(stop)  # WorkerFenced passes through as it is, for the CLI
                finally:
                    armed.cancel()
    except TimeoutError:
        logger.error("teardown exceeded the shutdown grace period; exiting without it")


async def _arm_deadline(stop: asyncio.Event, deadline: asyncio.Timeout, settings: Settings) -> None:
    await stop.wait()
    limit = max(1.0, settings.shutdown_grace_seconds - TEARDOWN_SLACK_SECONDS)
    deadline.reschedule(asyncio.get_running_loop().time() + limit)
