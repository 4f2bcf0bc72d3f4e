"""The anti-entropy audit, on its own (worker/audit.py): the registry and the table are made to
disagree by hand, and the audit repairs it within its period, counting `LeasesRepaired`.

- A session is dropped as lost: its registry entry goes, with no release, so the item still names
  our live session (what a lost reply or a lost release leaves). The audit adopts it again, from
  its effective checkpoint.
- The item is made to name another owner behind our back. The audit stops serving it at once.
"""

from __future__ import annotations

from dataclasses import replace

from types_aiobotocore_dynamodb import DynamoDBClient

from leaseworker.lease.admin import LeaseTableAdmin
from leaseworker.observability.metrics import MetricName
from leaseworker.settings import Settings
from leaseworker.worker.audit import AUDIT_EVERY_HEARTBEATS
from leaseworker_dev.feed.server import FeedServer
from tests.worker.harness import eventually, running


def audit_period(settings: Settings) -> float:
    return AUDIT_EVERY_HEARTBEATS * settings.heartbeat_seconds


async def test_a_held_connection_dropped_from_the_registry_is_adopted_again(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    settings = replace(settings, sink="null", lease_mode="session")
    admin = LeaseTableAdmin(ddb, table)
    async with FeedServer(rate=50) as feed:
        await admin.add("c0", feed.url_for("c0"))
        async with running(settings) as run:
            await eventually(lambda: run.worker.owned == ["c0"], 10, "c0 owned")

            async def checkpointed() -> bool:
                [item] = await admin.list()
                return int(item["checkpoint"]) > 0

            await eventually(checkpointed, 10, "a batched checkpoint of c0")
            # The registry entry deleted "by hand": the session ends as lost, which releases
            # nothing, so the item still names our live session, and nothing serves it.
            run.worker._registry.owned["c0"].session.lose("test: we lost track of it")
            await eventually(lambda: run.worker.owned == [], 2, "c0 dropped from the registry")
            [before] = await admin.list()
            assert before["lease_owner"] == settings.worker_id, before
            await eventually(
                lambda: run.worker.owned == ["c0"], audit_period(settings) + 2, "the audit adopts c0 again"
            )
            assert run.metrics.totals().get(MetricName.LeasesRepaired, 0) == 1
            adopted = run.worker._registry.owned["c0"].lease
            assert adopted.epoch == before["lease_epoch"]
            assert adopted.start_seq >= before["checkpoint"], "adopted from its effective checkpoint"


async def test_a_connection_the_table_no_longer_names_us_for_stops_being_served(
    ddb: DynamoDBClient, table: str, settings: Settings
) -> None:
    settings = replace(settings, sink="null", lease_mode="session")
    admin = LeaseTableAdmin(ddb, table)
    async with FeedServer(rate=50) as feed:
        await admin.add("c0", feed.url_for("c0"))
        async with running(settings) as run:
            await eventually(lambda: run.worker.owned == ["c0"], 10, "c0 owned")
            await ddb.update_item(  # behind our back: another owner, a newer epoch
                TableName=table,
                Key={"connection_id": {"S": "c0"}},
                UpdateExpression="SET lease_owner = :other ADD lease_epoch :one",
                ExpressionAttributeValues={":other": {"S": "someone-else"}, ":one": {"N": "1"}},
            )
            await eventually(
                lambda: run.worker.owned == [], audit_period(settings) + 2, "the audit stops serving c0"
            )
            assert run.metrics.totals().get(MetricName.LeasesRepaired, 0) == 1
            [item] = await admin.list()
            assert item["lease_owner"] == "someone-else", item
