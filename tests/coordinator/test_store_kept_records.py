"""TaskStore: records kept parsed after a commit are reused only while Redis still holds them."""

from __future__ import annotations

import asyncio

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
        await client.delete(keys.task_key("c8"))
        assert await store.load("c8") is None
        await client.aclose()

    asyncio.run(scenario())
