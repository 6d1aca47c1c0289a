"""AsyncOrgaClient and the sync client's ``wait`` against a real deployment: they block on the
task's streams (``XREAD BLOCK``) and return on completion or on a review, without polling."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

from coordinator.async_client import AsyncOrgaClient
from coordinator.client import WaitTimeoutError
from tests.integration.harness import PARTITIONS, REPO, Cluster

pytestmark = pytest.mark.integration

WANDERER = REPO / "examples" / "wanderer" / "task.yaml"


def _slow_task(seconds: int) -> dict[str, Any]:
    """One tool call that sleeps (no journal entry meanwhile), then an answer."""
    call = {"name": "run_command", "arguments": {"command": f"sleep {seconds}; echo slept"}}
    return {
        "goal": "sleep",
        "provider": {"kind": "scripted", "replies": [{"tool_calls": [call]}, "slept well"]},
        "steps": [{"id": "s", "instruction": "sleep"}],
        "stagnation": {"enabled": False},
    }


def _reads(url: str) -> int:
    """How many XREADs (not XREADGROUPs) the server has run: only watchers use them."""
    stats = redis.Redis.from_url(url).info("commandstats")
    return int(stats.get("cmdstat_xread", {}).get("calls", 0))


def test_wait_blocks_until_completion_without_polling(cluster: Cluster) -> None:
    """A task whose tool sleeps 6 s (longer than one blocking read, 5 s, and than redis-py's
    default socket timeout): ``wait`` returns its result once it completes, having issued a
    handful of blocking reads (one per wake, one per quiet 5 s), where polling every 50 ms
    would have sent 120; ``events()`` then replays it, ending with the completed status."""

    async def scenario() -> tuple[dict[str, Any], float, int, list[str]]:
        async with AsyncOrgaClient(cluster.redis_url, partitions=PARTITIONS) as client:
            task_id = await client.submit(_slow_task(6))
            before, started = _reads(cluster.redis_url), time.monotonic()
            result = await client.wait(task_id, timeout_s=90)
            elapsed, reads = time.monotonic() - started, _reads(cluster.redis_url) - before
            kinds = [f"{e.kind}:{e.data.get('status', '')}" async for e in client.events(task_id)]
            return result, elapsed, reads, kinds

    result, elapsed, reads, kinds = asyncio.run(scenario())
    assert result["status"] == "completed" and result["output"] == "slept well", result
    assert elapsed >= 6.0
    assert reads <= 15, f"{reads} XREADs in {elapsed:.1f}s: is wait polling?"
    assert kinds[-1] == "status:completed" and kinds.count("status:completed") == 1, kinds
    print(f"RESULT wait_xreads_for_6s_task {reads}")


def test_wait_returns_when_the_task_awaits_review(cluster: Cluster) -> None:
    """The wanderer escalates: AsyncOrgaClient.wait and OrgaClient.wait both return its
    result with the review's id, the status ``awaiting_review``; a decision through
    ``decide`` resumes it, and a wait then returns on its end."""

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with AsyncOrgaClient(cluster.redis_url, partitions=PARTITIONS) as client:
            task_id = await client.submit(WANDERER)
            waited = await client.wait(task_id, timeout_s=120)
            again = await asyncio.to_thread(cluster.client().wait, task_id, 30)
            await client.decide(str(waited["review_id"]), "abort", by="tester")
            return waited, {"again": again, "end": await client.wait(task_id, timeout_s=60)}

    waited, after = asyncio.run(scenario())
    assert waited["status"] == "awaiting_review" and waited["review_id"], waited
    assert after["again"]["review_id"] == waited["review_id"]
    assert after["end"]["status"] == "aborted" and "review_id" not in after["end"]


def test_wait_times_out_on_a_task_that_never_comes(cluster: Cluster) -> None:
    """An id nobody submitted: WaitTimeoutError after the time given, not a hang."""

    async def scenario() -> None:
        async with AsyncOrgaClient(cluster.redis_url, partitions=PARTITIONS) as client:
            await client.wait("never-submitted-0", timeout_s=1.0)

    started = time.monotonic()
    with pytest.raises(WaitTimeoutError):
        asyncio.run(scenario())
    assert time.monotonic() - started < 10


def test_follow_journal_blocks_and_ends_with_the_task(cluster: Cluster) -> None:
    """`OrgaClient.follow_journal` (``orga journal --follow``) yields every entry once, in
    order, and returns when the task ends, blocking between reads instead of sleeping."""
    client = cluster.client()
    task_id = client.submit(_slow_task(3))
    client.accepted(task_id, time.monotonic() + 30)
    before = _reads(cluster.redis_url)
    sequences = [entry.sequence for entry in client.follow_journal(task_id)]
    reads = _reads(cluster.redis_url) - before
    assert sequences == list(range(len(sequences))) and len(sequences) >= 6, sequences
    assert client.status(task_id)["status"] == "completed"
    assert reads <= 15, f"{reads} XREADs: is follow_journal polling?"
