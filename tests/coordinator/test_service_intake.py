"""Coordinator intake on a real Redis: ids checked, every task started once, aliases kept apart.

Issue 12, items 7 (task ids), 10 (a task started twice by two coordinators) and 6 (a
resubmission naming a live task's id and another task's idempotency key).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from coordinator.machine import MachineSettings
from coordinator.service import Coordinator, CoordinatorSettings
from coordinator.state import ChildRef, TaskRecord, TaskStatus
from shared import keys
from shared.task_spec import parse_task, parse_task_text
from tests.redis_server import RedisClientFactory

SETTINGS = CoordinatorSettings(machine=MachineSettings(workspace_root="/ws"), block_ms=10)
TASK = {"goal": "g", "steps": [{"id": "s", "instruction": "do it"}]}


def _scenario(
    redis_client: RedisClientFactory,
    body: Callable[[Redis, Coordinator, Coordinator], Awaitable[None]],
) -> None:
    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            mine = Coordinator(client, settings=SETTINGS, name="mine")
            theirs = Coordinator(client, settings=SETTINGS, name="theirs")
            await mine._ensure_groups()
            await body(client, mine, theirs)

    asyncio.run(run())


async def _submit(client: Redis, task_id: str, task: dict[str, Any] | None = None) -> None:
    await client.xadd(keys.intake_stream(0), {"task_id": task_id, "task": json.dumps(task or TASK)})


async def _events(client: Redis, name: str) -> list[dict[str, str]]:
    return [f for _i, f in await client.xrange(keys.events_stream(0)) if f.get("event") == name]


BAD_IDS = {
    "../escape": "path separators",
    ".": "'.' or '..'",
    "..": "'.' or '..'",
    "a/b": "path separators",
    "-leading-dash": "starting with a letter or digit",
    "x" * 1_000_000: "1000000 characters",
    "tab\there": "letters, digits",
}


def test_bad_task_ids_are_rejected_at_intake_with_the_reason(
    redis_client: RedisClientFactory,
) -> None:
    """An id that is not one plain folder name (or is huge) is on orga:rejected, saying why and
    how to fix it, and creates nothing; a valid id beside them is accepted and started."""

    async def body(client: Redis, mine: Coordinator, _theirs: Coordinator) -> None:
        for task_id in BAD_IDS:
            await _submit(client, task_id)
        await _submit(client, "good-1.a_b")
        await mine._intake_once()
        rejected = [f for _i, f in await client.xrange(keys.rejected_stream(0))]
        assert len(rejected) == len(BAD_IDS)
        for fields, (task_id, why) in zip(rejected, BAD_IDS.items(), strict=True):
            assert why in fields["error"], fields["error"]
            assert "is not valid" in fields["error"]
            assert fields["task_id"] == task_id[:128]
            assert len(fields["error"]) < 1000
        assert [k async for k in client.scan_iter(keys.task_key("*", 0))] == [
            keys.task_key("good-1.a_b", 0)
        ]
        assert [e["task_id"] for e in await _events(client, "accepted")] == ["good-1.a_b"]
        summary = await client.xpending(keys.intake_stream(0), keys.coordinator_group)
        assert summary["pending"] == 0

    _scenario(redis_client, body)


def test_a_task_is_started_once_when_two_coordinators_apply_its_start(
    redis_client: RedisClientFactory,
) -> None:
    """The coordinator whose kept copy is still pending loses the compare-and-set, sees the
    task running and does not start it again: one ``accepted`` event, one dispatch."""

    async def body(client: Redis, mine: Coordinator, theirs: Coordinator) -> None:
        spec = parse_task(TASK)
        await mine.store.create(TaskRecord(task_id="t", spec=spec, created_at=0, updated_at=0))
        assert await theirs._apply("t", lambda m: m.start())
        assert not await mine._apply("t", lambda m: m.start())  # its kept copy says pending
        assert len(await _events(client, "accepted")) == 1
        assert await client.xlen(keys.commit_outbox_stream(0)) == 1

    _scenario(redis_client, body)


def test_intake_leaves_the_start_to_the_lease_holder(redis_client: RedisClientFactory) -> None:
    """A coordinator that cannot take a new task's lease stores it but does not start it; the
    holder's next tick starts it, once."""

    async def body(client: Redis, mine: Coordinator, theirs: Coordinator) -> None:
        assert await theirs._hold("t")
        await _submit(client, "t")
        await mine._intake_once()
        record = await mine.store.load("t")
        assert record is not None and record.status.value == "pending"
        assert await _events(client, "accepted") == []
        await theirs._tick_once()
        await mine._tick_once()
        assert len(await _events(client, "accepted")) == 1
        assert await client.xlen(keys.commit_outbox_stream(0)) == 1

    _scenario(redis_client, body)


def _keyed(key: str) -> dict[str, Any]:
    return {**TASK, "idempotency_key": key}


def test_a_live_task_id_with_another_tasks_key_is_rejected_naming_both(
    redis_client: RedisClientFactory,
) -> None:
    """Resubmitting live task ``a``'s id with task ``b``'s idempotency key never makes ``a`` an
    alias of ``b``: the entry is on orga:rejected naming both ids, and ``a`` is untouched."""

    async def body(client: Redis, mine: Coordinator, _theirs: Coordinator) -> None:
        await _submit(client, "a", _keyed("key-a"))
        await _submit(client, "b", _keyed("key-b"))
        await mine._intake_once()
        before = await client.hgetall(keys.task_key("a", 0))
        await _submit(client, "a", _keyed("key-b"))
        await mine._intake_once()
        assert await client.hgetall(keys.task_key("a", 0)) == before
        assert "alias_of" not in before
        (rejected,) = [f for _i, f in await client.xrange(keys.rejected_stream(0))]
        assert rejected["task_id"] == "a"
        assert "task id 'a' is already a task" in rejected["error"]
        assert "belongs to task 'b'" in rejected["error"]
        events = [e["event"] for e in await _events(client, "resubmission_rejected")]
        assert events == ["resubmission_rejected"]
        assert await _events(client, "rejected") == []
        summary = await client.xpending(keys.intake_stream(0), keys.coordinator_group)
        assert summary["pending"] == 0

    _scenario(redis_client, body)


def test_a_new_id_with_a_used_key_becomes_an_expiring_alias(
    redis_client: RedisClientFactory,
) -> None:
    """A new id resubmitted with a used key is an alias of the key's task (expiring with the
    key), and the same resubmission again is a plain duplicate, not a rejection."""

    async def body(client: Redis, mine: Coordinator, _theirs: Coordinator) -> None:
        await _submit(client, "b", _keyed("key-b"))
        await mine._intake_once()
        for _ in range(2):
            await _submit(client, "c", _keyed("key-b"))
            await mine._intake_once()
        assert await client.hgetall(keys.task_key("c", 0)) == {"alias_of": "b"}
        assert 0 < await client.ttl(keys.task_key("c", 0)) <= keys.idempotency_ttl_s
        assert await client.xlen(keys.rejected_stream(0)) == 0
        assert len(await _events(client, "duplicate")) == 2
        assert len(await _events(client, "accepted")) == 1

    _scenario(redis_client, body)


def test_a_task_that_is_not_utf8_is_rejected_naming_the_byte(
    redis_client: RedisClientFactory,
) -> None:
    """The intake reads the task's bytes as Redis holds them: invalid UTF-8 (from any producer)
    is rejected naming its offset and the fix, never accepted with U+FFFD in its place."""

    async def run() -> None:
        async with redis_client() as raw, redis_client(decode_responses=True) as client:
            coordinator = Coordinator(raw, settings=SETTINGS, name="mine")  # bytes, as deployed
            await coordinator._ensure_groups()
            bad = (
                json.dumps(TASK)
                .replace('"g"', '"caf\\u00e9"')
                .encode()
                .replace(b"\\u00e9", b"\xe9")
            )
            await raw.xadd(keys.intake_stream(0), {"task_id": "latin1", "task": bad})
            await _submit(client, "good")
            await coordinator._intake_once()
            [rejected] = [f for _i, f in await client.xrange(keys.rejected_stream(0))]
            offset = bad.index(b"\xe9")
            assert rejected["task_id"] == "latin1"
            assert f"not valid UTF-8 at byte offset {offset} (line 1" in rejected["error"]
            assert "save it as UTF-8" in rejected["error"]
            assert await client.exists(keys.task_key("latin1", 0)) == 0
            assert [e["task_id"] for e in await _events(client, "accepted")] == ["good"]
            assert (await client.xpending(keys.intake_stream(0), keys.coordinator_group))[
                "pending"
            ] == 0

    asyncio.run(run())


def test_on_several_partitions_an_entry_is_created_in_its_tasks_partition_only(
    redis_client: RedisClientFactory,
) -> None:
    """With 4 partitions, an entry on its task's partition's intake is created there (a child's
    id in its root's); one on another partition's intake is rejected naming the right stream;
    one without an id gets an id in the partition it came on."""
    settings = CoordinatorSettings(
        machine=MachineSettings(workspace_root="/ws"), block_ms=10, partitions=4
    )

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            node = Coordinator(client, settings=settings, name="mine")
            await node._ensure_groups()
            home = keys.partition_of("root-1", 4)
            wrong = (home + 1) % 4
            await client.xadd(
                keys.intake_stream(home), {"task_id": "root-1", "task": json.dumps(TASK)}
            )
            await client.xadd(
                keys.intake_stream(wrong), {"task_id": "root-1.x", "task": json.dumps(TASK)}
            )
            await client.xadd(keys.intake_stream(wrong), {"task": json.dumps(TASK)})
            for _ in range(3):
                await node._intake_once()
            assert await client.hget(keys.task_key("root-1", home), "status") is not None
            assert await client.zscore(keys.deadlines_key(home), "root-1") is not None
            rejected = [f for _i, f in await client.xrange(keys.rejected_stream(wrong))]
            assert [r["task_id"] for r in rejected] == ["root-1.x"]
            assert f"partition {home} of 4" in rejected[0]["error"]
            assert keys.intake_stream(home) in rejected[0]["error"]
            created = await client.zrange(keys.deadlines_key(wrong), 0, -1)
            assert len(created) == 1
            assert {keys.partition_of(t, 4) for t in created} == {wrong}

    asyncio.run(run())


def test_a_new_task_is_created_started_in_one_script(redis_client: RedisClientFactory) -> None:
    """A task that is no sub-agent's is created with its start committed in one script call:
    stored at version 1 and running (no version 0 written), counted once (``running``, never
    ``pending``), active, indexed, due at its dispatch's deadline, leased to its starter, its
    idempotency key taken and its intake entry acknowledged; the dispatch is on the outbox and
    the record kept for the task's next answer."""

    async def body(client: Redis, mine: Coordinator, _theirs: Coordinator) -> None:
        async def scripts_run() -> int:  # however sent: alone, or in a pipeline with others
            stats = await client.info("commandstats")
            return sum(
                int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval")
            )

        before = await scripts_run()
        create = mine.store.create

        async def refused(*_args: object, **_kwargs: object) -> None:
            raise AssertionError("created apart from its start")

        mine.store.create = refused  # type: ignore[assignment,method-assign]
        await _submit(client, "t", _keyed("key-t"))
        await mine._intake_once()
        mine.store.create = create  # type: ignore[method-assign]
        assert await scripts_run() - before == 1
        task = await client.hgetall(keys.task_key("t", 0))
        assert task["version"] == "1" and task["status"] == "running"
        assert keys.status_counts(await client.hgetall(keys.status_counts_key(0))) == {"running": 1}
        assert await client.zrange(keys.deadlines_key(0), 0, -1) == ["t"]  # active
        assert await client.zscore(keys.task_index_key(0), "t") is not None
        record = mine.store.peek_kept("t")
        assert record is not None and record.awaiting is not None
        deadline = await client.zscore(keys.deadlines_key(0), "t")
        assert deadline == round(record.awaiting.deadline, 6)
        assert await client.get(keys.lease_key("t", 0)) == "mine"
        assert "t" in mine._held
        assert await client.get(keys.idempotency_key("key-t", 0)) == "t"
        summary = await client.xpending(keys.intake_stream(0), keys.coordinator_group)
        assert summary["pending"] == 0
        assert len(await _events(client, "accepted")) == 1
        assert await client.xlen(keys.commit_outbox_stream(0)) == 1
        assert await client.xlen(keys.journal_stream("t", 0)) == 1

    _scenario(redis_client, body)


def test_a_resubmission_of_a_live_tasks_id_leaves_its_kept_record(
    redis_client: RedisClientFactory,
) -> None:
    """Review of branch ``coord``: a client retrying a submission with the id of a task that
    is running (a duplicate) changes nothing of that task, nor of what this coordinator keeps
    of it (the record for its next answer, the conversation stored, its spec's JSON): on
    ``main`` the create script answered ``duplicate`` before anything was prepared;
    ``_create_started`` (now ``_prepare_started``) prepares a commit of a fresh record under
    the live task's id, which takes the live task's kept record and forgets its stored
    conversation."""

    async def body(client: Redis, mine: Coordinator, _theirs: Coordinator) -> None:
        await _submit(client, "t")
        await mine._intake_once()
        kept = mine.store.peek_kept("t")
        assert kept is not None and kept.version == 1
        stored, spec = mine.store._stored.get("t"), mine.store._specs.get("t")
        assert stored is not None and spec is not None
        await _submit(client, "t")  # the client's retry
        await mine._intake_once()
        assert len(await _events(client, "duplicate")) == 1
        assert mine.store.peek_kept("t") is kept, "the live task's kept record was dropped"
        assert mine.store._stored.get("t") is stored, "its stored conversation was forgotten"
        assert mine.store._specs.get("t") is spec, "its spec's JSON was replaced"

    _scenario(redis_client, body)


async def _parent(client: Redis, task_id: str, status: TaskStatus, child: str = "") -> None:
    """A parent task stored as its commits leave it, having created ``child`` for call ``c``."""
    children = [ChildRef(task_id=child, agent="a", call_id="c", step_id="s", iteration=0)]
    record = TaskRecord(
        task_id=task_id,
        spec=parse_task(TASK),
        created_at=0.0,
        updated_at=0.0,
        status=status,
        children=children if child else [],
    )
    await client.hset(
        keys.task_key(task_id, 0),
        mapping={"state": record.model_dump_json(), "status": status.value, "version": "1"},
    )


def _yaml_child(parent: str) -> str:
    return (
        "goal: g\nsteps:\n  - id: s\n    instruction: do it\n"
        f"delegation:\n  task_id: {parent}\n  step_id: s\n  iteration: 0\n  call_id: c\n"
    )


def test_a_task_naming_a_parent_in_yaml_is_not_started_when_its_parent_ended(
    redis_client: RedisClientFactory,
) -> None:
    """Review of branch ``coord``: whether a task is a sub-agent's is read from its text
    (``parent_link``: JSON holding ``"delegation"``) to choose to create it started, while its
    spec (YAML, or JSON with the key escaped) may name a parent all the same. On ``main`` such
    a task is created, then checked against its parent (``_parent_ended``) and cancelled when
    the parent ended; created started, it skips that check and runs. (The parent recorded the
    child: a parent that did not is refused, below.)"""

    async def body(client: Redis, mine: Coordinator, _theirs: Coordinator) -> None:
        await _parent(client, "gone", TaskStatus.COMPLETED, child="gone.1")
        await client.xadd(keys.intake_stream(0), {"task_id": "gone.1", "task": _yaml_child("gone")})
        await mine._intake_once()
        record = await mine.store.load("gone.1")
        assert record is not None and record.spec.delegation is not None
        assert record.status.value == "aborted", (
            f"a task whose parent ended is {record.status.value}, not cancelled"
        )

    _scenario(redis_client, body)


ESCAPED = json.dumps(
    {**TASK, "delegation": {"task_id": "p", "step_id": "s", "iteration": 0, "call_id": "c"}}
).replace('"delegation"', '"\\u0064elegation"')


@pytest.mark.parametrize("text", [_yaml_child("p"), ESCAPED], ids=["yaml", "escaped-json"])
def test_a_task_naming_a_live_parent_that_did_not_create_it_is_refused_in_any_form(
    redis_client: RedisClientFactory, text: str
) -> None:
    """A submitted task naming a live parent that did not record it as that call's child is
    refused however its spec is written: before, the recorded-child check read the text as JSON
    holding ``"delegation"`` (``parent_link``), so YAML or an escaped key made a sub-agent of any
    live parent (on ``main`` too)."""

    async def body(client: Redis, mine: Coordinator, _theirs: Coordinator) -> None:
        await _parent(client, "p", TaskStatus.RUNNING)
        assert parse_task_text(text).delegation is not None  # the spec does name the parent
        await client.xadd(keys.intake_stream(0), {"task_id": "p.1", "task": text})
        await mine._intake_once()
        assert await mine.store.load("p.1") is None
        rejected = await _events(client, "rejected")
        assert len(rejected) == 1 and "which did not create it" in rejected[0]["error"], rejected

    _scenario(redis_client, body)


def test_a_kept_record_of_a_purged_task_is_not_taken_for_its_ids_new_task(
    redis_client: RedisClientFactory,
) -> None:
    """A record this coordinator kept of a task it lost (its lease taken over; the task then
    ended there and was purged after the retention) is not taken for a new task of that id
    created by another coordinator at the same version: ``load`` (and the commit's
    compare-and-set) confirm a kept record by its ``created_at`` as well as its version."""

    async def body(client: Redis, mine: Coordinator, theirs: Coordinator) -> None:
        await _submit(client, "t", {**TASK, "goal": "first"})
        await mine._intake_once()
        kept = mine.store.peek_kept("t")
        assert kept is not None and kept.spec.goal == "first"
        # elsewhere: its lease lost, the task ended by another coordinator and purged
        await client.delete(
            keys.task_key("t", 0),
            keys.conversation_key("t", 0),
            keys.lease_key("t", 0),
            keys.journal_stream("t", 0),
            keys.journal_sequence_key("t", 0),
        )
        await _submit(client, "t", {**TASK, "goal": "second"})
        await theirs._intake_once()
        stored = await theirs.store.load("t")
        assert stored is not None and stored.spec.goal == "second"
        assert stored.version == kept.version
        record = await mine.store.load("t")
        assert record is not None
        assert record.spec.goal == "second", "the purged task's kept record was taken as current"

    _scenario(redis_client, body)


def test_a_lease_lost_drops_the_kept_record_of_its_task(redis_client: RedisClientFactory) -> None:
    """The renewal that finds a held task's lease taken over (or the task ended elsewhere)
    drops what this coordinator kept of it: another coordinator commits it from then on."""

    async def body(client: Redis, mine: Coordinator, theirs: Coordinator) -> None:
        await _submit(client, "lost")
        await _submit(client, "kept")
        await mine._intake_once()
        assert mine.store.peek_kept("lost") is not None
        await client.set(keys.lease_key("lost", 0), "theirs")
        mine._last_renewal = float("-inf")  # due now
        await mine._renew_leases()
        assert mine.store.peek_kept("lost") is None
        assert mine.store.peek_kept("kept") is not None

    _scenario(redis_client, body)
