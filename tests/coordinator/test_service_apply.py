"""Coordinator._apply on the record it kept: never a verdict drawn from a stale copy."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from redis.asyncio import Redis

from coordinator.machine import Effects, MachineSettings, TaskMachine
from coordinator.service import Coordinator, CoordinatorSettings
from coordinator.state import TaskRecord
from shared import keys
from shared.task_spec import parse_task

SETTINGS = CoordinatorSettings(machine=MachineSettings(workspace_root="/ws"))


def _record(task_id: str) -> TaskRecord:
    spec = parse_task({"goal": "g", "steps": [{"id": "s", "instruction": "do it"}]})
    return TaskRecord(task_id=task_id, spec=spec, created_at=0.0, updated_at=0.0)


def _scenario(redis_url: str, body: Any) -> None:
    async def run() -> None:
        client = Redis.from_url(redis_url)
        mine = Coordinator(client, settings=SETTINGS, name="mine")
        theirs = Coordinator(client, settings=SETTINGS, name="theirs")
        try:
            await mine.store.create(_record("t"))
            assert await mine._apply("t", lambda m: m.start())  # `mine` keeps version 1
            assert await theirs._apply("t", _touch)  # version 2, behind `mine`'s back
            await body(mine)
        finally:
            await client.aclose()

    asyncio.run(run())


def _touch(machine: TaskMachine) -> Effects:
    machine.record.output = "touched"
    return machine.effects


def _only_on_version_2(machine: TaskMachine) -> Effects:
    """An input that only the current state (version 2) accepts."""
    if machine.record.version != 2:
        machine.effects.changed = False
    else:
        machine.record.error = "applied"
    return machine.effects


def _refused_unless_version_2(machine: TaskMachine) -> Effects:
    if machine.record.version != 2:
        raise ValueError("not in the state this input needs")
    machine.record.error = "applied"
    return machine.effects


@pytest.mark.parametrize("step", [_only_on_version_2, _refused_unless_version_2])
def test_an_input_judged_on_a_stale_kept_record_is_judged_again(
    redis_url: str, redis_client: Any, step: Any
) -> None:
    """Ignored or refused on the stale copy, the input is applied to the stored record."""

    async def body(mine: Coordinator) -> None:
        assert await mine._apply("t", step)
        record = await mine.store.load("t")
        assert record is not None
        assert (record.version, record.output, record.error) == (3, "touched", "applied")

    _scenario(redis_url, body)


def test_a_refusal_on_the_current_record_stands(redis_url: str, redis_client: Any) -> None:
    """When the kept record is current after all, the machine's refusal is the answer."""

    async def body(mine: Coordinator) -> None:
        assert await mine._apply("t", _touch)  # retried on the stored record: `mine` keeps v3

        def refuse(machine: TaskMachine) -> Effects:
            raise ValueError("no")

        with pytest.raises(ValueError, match="no"):
            await mine._apply("t", refuse)

    _scenario(redis_url, body)


def test_the_liveness_read_carries_the_answer_marks_of_a_reasoning_that_may_chain(
    redis_url: str, redis_client: Any
) -> None:
    """The coordinator reads, with the awaited reasoning's scores, its answer marks: one
    marked direct is not held for the tools queue, one marked chained or not marked (a worker
    older than the marks) is."""

    async def run() -> None:
        client = Redis.from_url(redis_url)
        coordinator = Coordinator(client, settings=SETTINGS, name="mine")
        try:
            await coordinator.store.create(_record("t"))
            assert await coordinator._apply("t", lambda m: m.start())
            unmarked = await coordinator._liveness("t")
            assert unmarked is not None and unmarked.chains
            (fence_id,) = unmarked.scores
            assert unmarked.may_have_chained([fence_id])
            for via, chained in ((keys.ANSWERED_CHAINED, True), (keys.ANSWERED_DIRECT, False)):
                at = -time.time()
                member = keys.answered_via_member(fence_id, via)
                await client.zadd(keys.heartbeats_key, {fence_id: at, member: at})
                marked = await coordinator._liveness("t")
                assert marked is not None and marked.scores == {fence_id: at}
                assert marked.marks[member] == at
                assert marked.may_have_chained([fence_id]) is chained
                await asyncio.sleep(0.01)
        finally:
            await client.aclose()

    asyncio.run(run())
