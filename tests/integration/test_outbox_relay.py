"""The outbox relay is at least once: a dispatch sent twice (its relay killed between the send
and the removal, the entry found by the next relay's sweep and sent again) runs twice and is
applied once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import redis
from redis.asyncio import Redis

from coordinator.relay import CeleryPublisher, OutboxRelay
from coordinator.service import Coordinator, CoordinatorSettings
from orga.embedded_redis import EmbeddedRedis
from shared import keys
from shared.outbox import OutboxEntry
from shared.settings import OrgaSettings
from tests.integration.harness import (
    PARTITIONS,
    Cluster,
    assert_journal_is_clean,
    status_of,
    wait_until,
)

pytestmark = pytest.mark.integration

TASK = {
    "goal": "answer",
    "provider": {"kind": "scripted", "replies": ["done"]},
    "steps": [{"id": "s", "instruction": "say done"}],
    "stagnation": {"enabled": False},
}


async def _start_without_relay(url: str) -> None:
    """A coordinator that runs no relay takes the submission and commits the task's start:
    its first dispatch waits on the outbox."""
    client = Redis.from_url(url)
    try:
        settings = CoordinatorSettings(partitions=PARTITIONS)
        coordinator = Coordinator(client, name="starter", settings=settings)
        await coordinator._ensure_groups()
        await coordinator._intake_once()
    finally:
        await client.aclose()


async def _sent_twice(url: str, outbox: str) -> None:
    """The committing coordinator's relay sends the entry it was handed, then dies before
    removing it; relay ``live`` (the partition's next holder) finds it on the commits' outbox
    at its first round and sends it again."""
    client = Redis.from_url(url)
    publisher = CeleryPublisher.from_settings(OrgaSettings(redis_url=url, partitions=PARTITIONS))
    live = OutboxRelay(client, publisher, "live", block_ms=1, partitions=PARTITIONS)
    try:
        rows = [(i.decode(), f) for i, f in await client.xrange(outbox)]
        assert len(rows) == 1, rows
        publisher.publish([OutboxEntry.from_fields(i, f) for i, f in rows])  # no removal
        assert await client.xlen(outbox) == 1
        assert await live.relay_once() == 1
        assert await client.xlen(outbox) == 0
    finally:
        await live.close()
        await client.aclose()


def test_a_dispatch_sent_twice_is_applied_once(
    private_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    """Both copies of the reasoning dispatch (same Celery task id) run and answer; the
    coordinator applies the first answer and ignores the second (its fence is no longer
    awaited): the task completes with its iteration applied once."""
    cluster = Cluster(private_redis.url, tmp_path)
    raw = redis.Redis.from_url(private_redis.url)
    try:
        client = cluster.client()
        task_id = client.submit(TASK)
        asyncio.run(_start_without_relay(private_redis.url))
        p = keys.partition_of(task_id, PARTITIONS)
        asyncio.run(_sent_twice(private_redis.url, keys.commit_outbox_stream(p)))
        queued = [json.loads(m)["headers"]["id"] for m in raw.lrange(keys.reasoning_queue, 0, -1)]
        assert len(queued) == 2 and queued[0] == queued[1], queued

        cluster.worker()
        cluster.coordinator()

        def answered_twice() -> bool:
            info = raw.xinfo_stream(keys.observations_stream(p))
            return int(info["entries-added"]) == 2 and int(info["length"]) == 0

        wait_until(lambda: status_of(client, task_id) == "completed", 60, "the task to complete")
        # Both copies ran and answered; each answer was handled (applied, or ignored as a
        # duplicate: an observation is deleted once handled), and nothing else was sent.
        wait_until(answered_twice, 60, "both answers published and handled")
        assert raw.llen(keys.reasoning_queue) == 0 and raw.xlen(keys.commit_outbox_stream(p)) == 0
        journal = client.journal(task_id)
        assert_journal_is_clean(journal)
        reasoned = [e for e in journal if e.event.type == "ReasoningComplete"]
        assert len(reasoned) == 1, [e.event.type for e in journal]
    finally:
        cluster.stop()
        raw.close()
