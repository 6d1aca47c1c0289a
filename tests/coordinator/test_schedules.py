"""Schedules in Redis: the book the CLI edits (fakeredis) and the scheduler the coordinators run
(real Redis: its advance is a Lua compare-and-set), with an injected clock."""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import UTC, datetime
from typing import Any

import fakeredis
import pytest
import redis
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from coordinator.machine import MachineSettings, TaskMachine
from coordinator.schedules import (
    ScheduleBook,
    ScheduleExistsError,
    ScheduleNotFoundError,
    Scheduler,
)
from coordinator.state import TaskRecord
from coordinator.store import TaskStore
from shared import keys
from shared.schedule import Schedule, fire_key, fire_task_id
from shared.task_spec import parse_task
from tests.redis_server import RedisClientFactory


def _at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


NOW = _at("2026-12-03T10:07:30")


def _schedule(name: str = "minutely", **fields: Any) -> Schedule:
    data: dict[str, Any] = {"name": name, "cron": "* * * * *", "task": {"goal": "tick"}}
    data.update(fields)
    return Schedule.model_validate(data)


class Clock:
    """A clock the test moves."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _book(clock: Clock) -> ScheduleBook:
    return ScheduleBook(fakeredis.FakeRedis(decode_responses=True), clock=clock)


# -- the book (fakeredis) ------------------------------------------------------------------


def test_add_stores_the_schedule_due_at_its_first_fire() -> None:
    """A new schedule is due at the first cron time after now."""
    book = _book(Clock(NOW))
    assert book.add(_schedule()) == _at("2026-12-03T10:08:00")
    (view,) = book.views()
    assert view.schedule.name == "minutely"
    assert view.next_at == _at("2026-12-03T10:08:00")
    assert view.last_fire is None


def test_adding_a_taken_name_is_refused() -> None:
    """A second schedule of one name says to remove the first."""
    book = _book(Clock(NOW))
    book.add(_schedule())
    with pytest.raises(ScheduleExistsError, match="`orga schedule remove minutely` first"):
        book.add(_schedule(cron="*/5 * * * *"))


def test_pause_and_resume() -> None:
    """Paused, a schedule is not due; resumed, it is due at its next time after now."""
    clock = Clock(NOW)
    book = _book(clock)
    book.add(_schedule())
    book.pause("minutely")
    (view,) = book.views()
    assert view.schedule.paused and view.next_at is None
    clock.now = _at("2026-12-03T11:00:10")
    assert book.resume("minutely") == _at("2026-12-03T11:01:00")
    (view,) = book.views()
    assert not view.schedule.paused and view.next_at == _at("2026-12-03T11:01:00")


def test_unknown_names_say_which_exist() -> None:
    """pause, resume, remove and run of an unknown name list the known schedules."""
    book = _book(Clock(NOW))
    book.add(_schedule())
    for action in (book.pause, book.resume, book.remove, book.run_now):
        with pytest.raises(ScheduleNotFoundError, match="no schedule 'nope'; known schedules: "):
            action("nope")


def test_remove_deletes_the_schedule() -> None:
    """A removed schedule is neither listed nor due."""
    book = _book(Clock(NOW))
    book.add(_schedule())
    book.remove("minutely")
    assert book.views() == []
    assert book.redis.zcard(keys.schedules_due_key) == 0


def test_run_now_submits_the_task_with_a_run_key() -> None:
    """run puts the task on the intake with a key of its own and its derived task id."""
    book = _book(Clock(NOW))
    book.add(_schedule())
    task_id = book.run_now("minutely")
    ((_entry, fields),) = book.redis.xrange(keys.intake_stream(0))
    key = fire_key("minutely", NOW, kind="run")
    assert fields["task_id"] == task_id == fire_task_id(key)
    assert json.loads(fields["task"])["idempotency_key"] == key


# -- the scheduler (real Redis) ------------------------------------------------------------


def _run(redis_client: RedisClientFactory, body: Any) -> Any:
    async def scenario() -> Any:
        async with redis_client(decode_responses=True) as client:
            return await body(client)

    return asyncio.run(scenario())


async def _store(client: Redis, schedule: Schedule, due_at: float) -> None:
    await client.hset(keys.schedules_key, schedule.name, schedule.model_dump_json())
    await client.zadd(keys.schedules_due_key, {schedule.name: due_at})


async def _intake(client: Redis) -> list[dict[str, Any]]:
    rows = await client.xrange(keys.intake_stream(0))
    return [{**fields, "task": json.loads(fields["task"])} for _id, fields in rows]


def test_two_schedulers_submit_one_fire_under_one_key(redis_client: RedisClientFactory) -> None:
    """Two schedulers looking at once submit one fire under one key and move the schedule once."""
    due = _at("2026-12-03T10:08:00")
    clock = Clock(due + 0.5)

    async def body(client: Redis) -> None:
        await _store(client, _schedule(), due)
        first, second = Scheduler(client, clock=clock), Scheduler(client, clock=clock)
        fired = await asyncio.gather(first.fire_due(), second.fire_due())
        key = fire_key("minutely", due)
        assert {task_id for ids in fired for task_id in ids} == {fire_task_id(key)}
        entries = await _intake(client)
        assert {e["task_id"] for e in entries} == {fire_task_id(key)}
        assert {e["task"]["idempotency_key"] for e in entries} == {key}
        assert await client.zscore(keys.schedules_due_key, "minutely") == due + 60
        last = json.loads(await client.hget(keys.schedule_fires_key, "minutely"))
        assert last["task_id"] == fire_task_id(key) and last["fire_at"] == due
        assert await first.fire_due() == []  # nothing due until the next minute

    _run(redis_client, body)


def test_a_fire_interrupted_before_the_advance_is_submitted_again_under_its_key(
    redis_client: RedisClientFactory,
) -> None:
    """A fire resubmitted after a crash before the advance carries the same key and task id."""
    due = _at("2026-12-03T10:08:00")
    clock = Clock(due + 1)

    async def body(client: Redis) -> None:
        await _store(client, _schedule(), due)
        await Scheduler(client, clock=clock).fire_due()
        await client.zadd(keys.schedules_due_key, {"minutely": due})  # the advance never ran
        clock.now = due + 20
        await Scheduler(client, clock=clock).fire_due()
        entries = await _intake(client)
        assert len(entries) == 2
        assert len({(e["task_id"], e["task"]["idempotency_key"]) for e in entries}) == 1

    _run(redis_client, body)


def test_fires_missed_during_an_outage_are_skipped(redis_client: RedisClientFactory) -> None:
    """With catch_up skip, an hour down submits nothing and the next fire is after now."""
    due = _at("2026-12-03T10:15:00")
    clock = Clock(_at("2026-12-03T11:07:00"))

    async def body(client: Redis) -> None:
        await _store(client, _schedule(cron="*/15 * * * *"), due)
        assert await Scheduler(client, clock=clock).fire_due() == []
        assert await _intake(client) == []
        next_at = await client.zscore(keys.schedules_due_key, "minutely")
        assert next_at == _at("2026-12-03T11:15:00")

    _run(redis_client, body)


def test_fires_missed_during_an_outage_are_caught_up_once(
    redis_client: RedisClientFactory,
) -> None:
    """With catch_up once, an hour down submits one task, for the latest missed fire."""
    due = _at("2026-12-03T10:15:00")
    clock = Clock(_at("2026-12-03T11:07:00"))

    async def body(client: Redis) -> None:
        await _store(client, _schedule(cron="*/15 * * * *", catch_up="once"), due)
        scheduler = Scheduler(client, clock=clock)
        assert len(await scheduler.fire_due()) == 1
        assert await scheduler.fire_due() == []
        (entry,) = await _intake(client)
        latest = _at("2026-12-03T11:00:00")
        assert entry["task"]["idempotency_key"] == fire_key("minutely", latest)
        last = json.loads(await client.hget(keys.schedule_fires_key, "minutely"))
        assert last["caught_up"] is True
        assert await client.zscore(keys.schedules_due_key, "minutely") == _at("2026-12-03T11:15:00")

    _run(redis_client, body)


def test_a_schedule_removed_while_due_is_dropped(redis_client: RedisClientFactory) -> None:
    """A due entry whose schedule is gone fires nothing and leaves the due set."""
    due = _at("2026-12-03T10:08:00")

    async def body(client: Redis) -> None:
        await client.zadd(keys.schedules_due_key, {"gone": due})
        assert await Scheduler(client, clock=Clock(due + 1)).fire_due() == []
        assert await client.zcard(keys.schedules_due_key) == 0

    _run(redis_client, body)


# -- overlap: a fire while the schedule's last run goes (real Redis, the real store) ---------


async def _read_intake(client: Redis) -> list[tuple[str, dict[str, str]]]:
    """What a coordinator's intake read takes (delivered, not yet acknowledged)."""
    with contextlib.suppress(ResponseError):  # the group exists
        await client.xgroup_create(keys.intake_stream(0), keys.coordinator_group, id="0")
    read = await client.xreadgroup(
        keys.coordinator_group, "c1", {keys.intake_stream(0): ">"}, count=100
    )
    return [(entry_id, fields) for _stream, rows in read for entry_id, fields in rows]


async def _create(store: TaskStore, entry_id: str, fields: dict[str, str]) -> TaskRecord:
    """The intake's creation of the entry's task (acknowledging the entry)."""
    spec = parse_task(json.loads(fields["task"]))
    record = TaskRecord(task_id=fields["task_id"], spec=spec, created_at=1.0, updated_at=1.0)
    await store.create(record, ack=(keys.intake_stream(0), keys.coordinator_group, entry_id))
    return record


async def _end(store: TaskStore, record: TaskRecord) -> None:
    """The task ends (cancelled by an operator, as any terminal commit)."""
    machine = TaskMachine(record, 2.0, MachineSettings(workspace_root="/ws"))
    await store.commit(machine.record, machine.cancel("ended for the test"))


def _task_of(name: str, fire_at: float) -> str:
    return fire_task_id(fire_key(name, fire_at))


def test_skip_drops_fires_while_the_last_run_goes(redis_client: RedisClientFactory) -> None:
    """With overlap skip (the default), fires while the last run is unread, being read or
    running are dropped; the first fire after it ended runs."""
    due = _at("2026-12-03T10:08:00")
    clock = Clock(due + 0.5)

    async def body(client: Redis) -> None:
        await _store(client, _schedule(), due)
        scheduler, store = Scheduler(client, clock=clock), TaskStore(client)
        assert await scheduler.fire_due() == [_task_of("minutely", due)]
        clock.now = due + 60.5  # its intake entry is not read yet
        assert await scheduler.fire_due() == []
        ((entry_id, fields),) = await _read_intake(client)
        clock.now = due + 120.5  # read, its task not created yet
        assert await scheduler.fire_due() == []
        record = await _create(store, entry_id, fields)
        clock.now = due + 180.5  # running
        assert await scheduler.fire_due() == []
        await _end(store, record)
        clock.now = due + 240.5
        assert await scheduler.fire_due() == [_task_of("minutely", due + 240)]
        assert [e["task_id"] for e in await _intake(client)] == [
            _task_of("minutely", due), _task_of("minutely", due + 240)
        ]  # fmt: skip
        assert await client.zscore(keys.schedules_due_key, "minutely") == due + 300

    _run(redis_client, body)


def test_allow_fires_while_the_last_run_goes(redis_client: RedisClientFactory) -> None:
    """With overlap allow, every fire is submitted, the last run going or not."""
    due = _at("2026-12-03T10:08:00")
    clock = Clock(due + 0.5)

    async def body(client: Redis) -> None:
        await _store(client, _schedule(overlap="allow"), due)
        scheduler = Scheduler(client, clock=clock)
        assert await scheduler.fire_due() == [_task_of("minutely", due)]
        clock.now = due + 60.5
        assert await scheduler.fire_due() == [_task_of("minutely", due + 60)]

    _run(redis_client, body)


def test_a_run_rejected_at_intake_does_not_hold_the_next_fire(
    redis_client: RedisClientFactory,
) -> None:
    """A fire whose intake entry was rejected (acknowledged, no task) has nothing running."""
    due = _at("2026-12-03T10:08:00")
    clock = Clock(due + 0.5)

    async def body(client: Redis) -> None:
        await _store(client, _schedule(), due)
        scheduler, store = Scheduler(client, clock=clock), TaskStore(client)
        await scheduler.fire_due()
        ((entry_id, fields),) = await _read_intake(client)
        await store.reject_submission(entry_id, fields["task_id"], fields["task"], "refused")
        clock.now = due + 60.5
        assert await scheduler.fire_due() == [_task_of("minutely", due + 60)]

    _run(redis_client, body)


def test_queue_keeps_the_first_fire_and_submits_it_when_the_run_ends(
    redis_client: RedisClientFactory,
) -> None:
    """With overlap queue, the first fire while the run goes waits (later ones are dropped)
    and two schedulers submit it once when the run ends; it is then the run the next fire
    waits for."""
    due = _at("2026-12-03T10:08:00")
    clock = Clock(due + 0.5)

    async def body(client: Redis) -> None:
        await _store(client, _schedule(overlap="queue"), due)
        first, second = Scheduler(client, clock=clock), Scheduler(client, clock=clock)
        store = TaskStore(client)
        await first.fire_due()
        ((entry_id, fields),) = await _read_intake(client)
        record = await _create(store, entry_id, fields)
        for minute in (1, 2):  # two fires while it runs, by two schedulers at once
            clock.now = due + 60 * minute + 0.5
            assert await asyncio.gather(first.fire_due(), second.fire_due()) == [[], []]
        waiting = json.loads(await client.hget(keys.schedules_queued_key, "minutely"))
        assert waiting["fire_at"] == due + 60 and waiting["after"] == record.task_id
        await _end(store, record)
        clock.now = due + 125.0  # no cron time due: the queued fire goes when the run ended
        released = await asyncio.gather(first.fire_due(), second.fire_due())
        assert {t for ids in released for t in ids} == {_task_of("minutely", due + 60)}
        assert not await client.hexists(keys.schedules_queued_key, "minutely")
        last = json.loads(await client.hget(keys.schedule_fires_key, "minutely"))
        assert last["task_id"] == _task_of("minutely", due + 60) and last["queued"] is True
        clock.now = due + 180.5  # the released run is unread: this fire waits for it
        assert await first.fire_due() == []
        waiting = json.loads(await client.hget(keys.schedules_queued_key, "minutely"))
        assert waiting["fire_at"] == due + 180

    _run(redis_client, body)


def test_a_manual_run_is_the_run_the_next_fire_waits_for(
    redis_client: RedisClientFactory, redis_url: str
) -> None:
    """`orga schedule run` records its run as the schedule's last: a fire while it goes is
    dropped (skip)."""
    due = _at("2026-12-03T10:08:00")
    clock = Clock(due - 10)
    book = ScheduleBook(redis.Redis.from_url(redis_url, decode_responses=True), clock=clock)

    async def body(client: Redis) -> None:
        book.add(_schedule())
        manual = book.run_now("minutely")
        clock.now = due + 0.5
        assert await Scheduler(client, clock=clock).fire_due() == []
        assert [e["task_id"] for e in await _intake(client)] == [manual]
        last = json.loads(await client.hget(keys.schedule_fires_key, "minutely"))
        assert last["task_id"] == manual and last["run"] is True

    try:
        _run(redis_client, body)
    finally:
        book.redis.close()


def test_the_queued_fire_is_listed_and_pausing_drops_it() -> None:
    """`orga schedule list` shows the fire waiting; pause (and remove) drop it."""
    book = _book(Clock(NOW))
    book.add(_schedule(overlap="queue"))
    wait = {"fire_at": NOW, "after": "t1", "at": NOW}
    book.redis.hset(keys.schedules_queued_key, "minutely", json.dumps(wait))
    (view,) = book.views()
    assert view.queued == wait
    book.pause("minutely")
    (view,) = book.views()
    assert view.queued is None
