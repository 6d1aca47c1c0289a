"""TaskStore: records kept parsed after a commit are reused only while Redis still holds them."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from coordinator.machine import MachineSettings, TaskMachine
from coordinator.state import TaskRecord
from coordinator.store import CommitConflictError, TaskStore
from shared import keys
from shared.task_spec import parse_task

SETTINGS = MachineSettings(workspace_root="/ws")


def _record(task_id: str) -> TaskRecord:
    spec = parse_task({"goal": "g", "steps": [{"id": "s", "instruction": "do it"}]})
    return TaskRecord(task_id=task_id, spec=spec, created_at=0.0, updated_at=0.0)


async def _started(store: TaskStore, task_id: str) -> TaskRecord:
    await store.create(_record(task_id))
    record = await store.load(task_id)
    assert record is not None
    machine = TaskMachine(record, 1.0, SETTINGS)
    await store.commit(machine.record, machine.start())
    return machine.record


def test_load_after_own_commit_returns_the_committed_record(redis_url: str) -> None:
    """The next load hands back the very record this store committed, at its version."""

    async def scenario() -> None:
        client = Redis.from_url(redis_url)
        store = TaskStore(client)
        committed = await _started(store, "c1")
        loaded = await store.load("c1")
        assert loaded is committed
        assert loaded.version == 1
        await client.aclose()

    asyncio.run(scenario())


def test_load_reads_redis_when_another_store_committed_since(redis_url: str) -> None:
    """A newer version written by another coordinator is read from Redis, not the kept one."""

    async def scenario() -> None:
        client = Redis.from_url(redis_url)
        mine, theirs = TaskStore(client), TaskStore(client)
        kept = await _started(mine, "c2")
        other = await theirs.load("c2")
        assert other is not None and other is not kept
        machine = TaskMachine(other, 2.0, SETTINGS)
        await theirs.commit(machine.record, machine.cancel("operator"))
        loaded = await mine.load("c2")
        assert loaded is not None and loaded is not kept
        assert loaded.version == 2
        assert loaded.status.value == "aborted"
        await client.aclose()

    asyncio.run(scenario())


def test_a_loaded_record_is_handed_out_once(redis_url: str) -> None:
    """Two loads without a commit between them never share one object."""

    async def scenario() -> None:
        client = Redis.from_url(redis_url)
        store = TaskStore(client)
        await _started(store, "c3")
        first, second = await store.load("c3"), await store.load("c3")
        assert first is not None and second is not None
        assert first is not second
        assert first.model_dump() == second.model_dump()
        await client.aclose()

    asyncio.run(scenario())


def test_a_conflicting_commit_keeps_nothing(redis_url: str) -> None:
    """After a CommitConflictError the next load parses the stored state."""

    async def scenario() -> None:
        client = Redis.from_url(redis_url)
        store = TaskStore(client)
        await _started(store, "c4")
        stale = await store.load("c4")
        fresh = await store.load("c4")
        assert stale is not None and fresh is not None
        await store.commit(fresh, TaskMachine(fresh, 2.0, SETTINGS).cancel("first"))
        try:
            await store.commit(stale, TaskMachine(stale, 3.0, SETTINGS).cancel("second"))
        except CommitConflictError:
            pass
        else:
            raise AssertionError("the stale commit should conflict")
        loaded = await store.load("c4")
        assert loaded is not None and loaded is not stale
        assert loaded.error == "cancelled: first"
        await client.aclose()

    asyncio.run(scenario())


def test_terminal_records_and_overflow_are_not_kept(redis_url: str) -> None:
    """A finished task is not kept, and the budget evicts the least recently written first."""

    async def scenario() -> None:
        client = Redis.from_url(redis_url)
        size = len(_record("x").model_dump_json())
        store = TaskStore(client, record_cache_bytes=int(size * 2.5))
        first = await _started(store, "c5")
        await _started(store, "c6")
        await _started(store, "c7")
        assert (await store.load("c5")) is not first
        done = await store.load("c6")
        assert done is not None
        await store.commit(done, TaskMachine(done, 2.0, SETTINGS).cancel("stop"))
        assert (await store.load("c6")) is not done
        await client.aclose()

    asyncio.run(scenario())


def test_deleted_task_is_not_served_from_memory(redis_url: str) -> None:
    """A task removed from Redis loads as None even though its record was kept."""

    async def scenario() -> None:
        client = Redis.from_url(redis_url)
        store = TaskStore(client)
        await _started(store, "c8")
        await client.delete(keys.task_key("c8", 0))
        assert await store.load("c8") is None
        await client.aclose()

    asyncio.run(scenario())


def test_a_task_spec_is_kept_encoded_until_the_task_ends_within_a_byte_budget(
    redis_url: str,
) -> None:
    """The encoded spec of a live task is kept for its next commits; its terminal commit drops
    it, and the specs kept never exceed ``spec_cache_bytes``."""

    async def scenario() -> None:
        client = Redis.from_url(redis_url)
        store = TaskStore(client)
        record = await _started(store, "s1")
        assert "s1" in store._specs
        spec_bytes = store._specs_bytes
        assert spec_bytes == len(store._specs["s1"][1]) > 0
        machine = TaskMachine(record, 2.0, SETTINGS)
        await store.commit(machine.record, machine.cancel("operator"))
        assert "s1" not in store._specs and store._specs_bytes == 0
        small = TaskStore(client, spec_cache_bytes=spec_bytes + spec_bytes // 2)
        for task_id in ("s2", "s3", "s4"):
            await _started(small, task_id)
        assert list(small._specs) == ["s4"]  # room for one: the oldest evicted
        assert small._specs_bytes == spec_bytes
        await client.aclose()

    asyncio.run(scenario())


def test_a_conflicting_commit_keeps_the_conversation_a_newer_commit_stored(
    redis_url: str,
) -> None:
    """A commit prepared before a newer commit of the task was written conflicts: the stored
    conversation remembered from the newer commit stays (the next commit appends to it,
    rather than rewriting the conversation under a new epoch)."""

    async def scenario() -> None:
        client = Redis.from_url(redis_url)
        store = TaskStore(client)
        record = await _started(store, "s5")
        stale = record.model_copy(deep=True)
        stale_machine = TaskMachine(stale, 2.0, SETTINGS)
        stale.error = "stale"
        late = store.prepare(stale, stale_machine.effects)
        newer = await store.load("s5")
        assert newer is not None
        machine = TaskMachine(newer, 3.0, SETTINGS)
        newer.error = "newer"
        await store.commit(newer, machine.effects)
        remembered = store._stored["s5"]
        with pytest.raises(CommitConflictError):
            await store.commit_prepared(late)
        assert store._stored.get("s5") is remembered
        assert not store.conversation_delta(newer).rewrite
        await client.aclose()

    asyncio.run(scenario())
