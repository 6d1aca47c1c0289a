"""Schedules in Redis: the book the CLI edits, and the scheduler every coordinator runs.

Keys (:mod:`shared.keys`): ``orga:schedules`` (name -> schedule JSON), ``orga:schedules:due``
(active schedules by their next fire time; a paused schedule is not in it) and
``orga:schedules:fired`` (name -> the last fire).

Firing is safe with any number of coordinators. Each looks at the schedules that are due, submits
the fire to the intake stream with the fire's idempotency key and task id
(:func:`shared.schedule.fire_key`), and only then moves the schedule's due time forward with a
compare-and-set: a coordinator that crashed in between leaves the schedule due, the next look
submits the same fire again, and the intake's idempotency makes both one task. Two coordinators
looking at once submit the same fire twice, and again the intake keeps one.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from redis.asyncio import Redis as AsyncRedis

from shared import keys
from shared.errors import OrgaError
from shared.schedule import DEFAULT_GRACE_S, Schedule, fire_key, fire_task_id, plan_fire

__all__ = [
    "ScheduleBook",
    "ScheduleExistsError",
    "ScheduleNotFoundError",
    "ScheduleView",
    "Scheduler",
    "intake_fields",
]

log = logging.getLogger("orga.schedules")


class ScheduleExistsError(OrgaError):
    """A schedule of that name exists already."""


class ScheduleNotFoundError(OrgaError, LookupError):
    """No schedule of that name."""


def intake_fields(schedule: Schedule, fire_at: float, key: str) -> dict[str, str]:
    """The intake entry of one fire (what :meth:`OrgaClient.submit` writes)."""
    return {
        "task_id": fire_task_id(key),
        "task": json.dumps(schedule.fire_task(fire_at, key)),
        "at": f"{time.time():.3f}",
    }


@dataclass(frozen=True, slots=True)
class ScheduleView:
    """A schedule as ``orga schedule list`` shows it."""

    schedule: Schedule
    next_at: float | None
    last_fire: dict[str, Any] | None


@dataclass
class ScheduleBook:
    """Add, pause, resume, remove and run schedules (the ``orga schedule`` commands)."""

    redis: redis.Redis
    clock: Callable[[], float] = time.time

    def add(self, schedule: Schedule) -> float:
        """Store a new schedule and return its first fire time; ScheduleExistsError if taken."""
        first = schedule.next_fire_after(self.clock())

        def write(pipe: Any) -> None:
            if pipe.hexists(keys.schedules_key, schedule.name):
                raise ScheduleExistsError(
                    f"schedule {schedule.name!r} exists already; `orga schedule remove "
                    f"{schedule.name}` first, or choose another name"
                )
            pipe.multi()
            pipe.hset(keys.schedules_key, schedule.name, schedule.model_dump_json())
            if not schedule.paused:
                pipe.zadd(keys.schedules_due_key, {schedule.name: first})

        self.redis.transaction(write, keys.schedules_key)
        return first

    def get(self, name: str) -> Schedule:
        """The schedule called ``name``; ScheduleNotFoundError naming the known ones."""
        raw = cast("str | None", self.redis.hget(keys.schedules_key, name))
        if raw is None:
            names = sorted(cast("list[str]", self.redis.hkeys(keys.schedules_key)))
            known = ", ".join(repr(n) for n in names) or "none"
            raise ScheduleNotFoundError(f"no schedule {name!r}; known schedules: {known}")
        return Schedule.model_validate_json(raw)

    def views(self) -> list[ScheduleView]:
        """Every schedule with its next fire time and its last fire, by name."""
        raw = cast("dict[str, str]", self.redis.hgetall(keys.schedules_key))
        schedules = sorted(
            (Schedule.model_validate_json(v) for v in raw.values()), key=lambda s: s.name
        )
        names = [s.name for s in schedules]
        due = self.redis.zmscore(keys.schedules_due_key, names) if names else []
        fired = cast(
            "list[str | None]", self.redis.hmget(keys.schedule_fires_key, names) if names else []
        )
        return [
            ScheduleView(s, d, json.loads(f) if f else None)
            for s, d, f in zip(schedules, due, fired, strict=True)
        ]

    def pause(self, name: str) -> None:
        """Stop firing ``name`` (its fires until resumed are not run)."""
        self._set_paused(name, paused=True)

    def resume(self, name: str) -> float:
        """Fire ``name`` again from its next fire time after now, which is returned."""
        return self._set_paused(name, paused=False)

    def _set_paused(self, name: str, paused: bool) -> float:
        schedule = self.get(name).model_copy(update={"paused": paused})
        upcoming = schedule.next_fire_after(self.clock())

        def write(pipe: Any) -> None:
            if not pipe.hexists(keys.schedules_key, name):
                raise ScheduleNotFoundError(f"schedule {name!r} was removed meanwhile")
            pipe.multi()
            pipe.hset(keys.schedules_key, name, schedule.model_dump_json())
            if paused:
                pipe.zrem(keys.schedules_due_key, name)
            else:
                pipe.zadd(keys.schedules_due_key, {name: upcoming})

        self.redis.transaction(write, keys.schedules_key)
        return upcoming

    def remove(self, name: str) -> None:
        """Delete ``name``; ScheduleNotFoundError if there is none. Tasks it submitted stay."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hdel(keys.schedules_key, name)
        pipe.zrem(keys.schedules_due_key, name)
        pipe.hdel(keys.schedule_fires_key, name)
        removed, *_ = pipe.execute()
        if not removed:
            self.get(name)  # raises, naming the known ones

    def run_now(self, name: str) -> str:
        """Submit ``name``'s task now (paused or not); returns the task id."""
        schedule = self.get(name)
        now = self.clock()
        key = fire_key(name, now, kind="run")
        fields = intake_fields(schedule, now, key)
        self.redis.xadd(
            keys.intake_stream, cast("Any", fields), maxlen=keys.intake_maxlen, approximate=True
        )
        return fields["task_id"]


# Move a schedule's due time from the time this look saw to the next one, and record the fire,
# unless another coordinator moved it first or the schedule was paused or removed (ZREM).
_ADVANCE = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then return 0 end
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
end
if ARGV[4] ~= '' then redis.call('HSET', KEYS[2], ARGV[1], ARGV[4]) end
return 1
"""


@dataclass
class Scheduler:
    """Fires the due schedules; every coordinator runs one (``fire_due`` about every second).

    ``clock`` is injected so tests drive time instead of waiting for a cron minute.
    """

    redis: AsyncRedis
    clock: Callable[[], float] = time.time
    grace_s: float = DEFAULT_GRACE_S
    batch: int = 100
    _advance: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._advance = self.redis.register_script(_ADVANCE)

    async def fire_due(self) -> list[str]:
        """Look at every due schedule once; the task ids this look submitted."""
        now = self.clock()
        due = cast(
            "list[tuple[Any, float]]",
            await self.redis.zrangebyscore(
                keys.schedules_due_key, "-inf", now, start=0, num=self.batch, withscores=True
            ),
        )
        submitted = []
        for raw_name, due_at in due:
            name = _text(raw_name)
            try:
                task_id = await self._look(name, float(due_at), now)
            except (ValueError, TypeError):
                log.exception("schedule.invalid", extra={"schedule": name})
                continue
            if task_id is not None:
                submitted.append(task_id)
        return submitted

    async def _look(self, name: str, due_at: float, now: float) -> str | None:
        raw = await self.redis.hget(keys.schedules_key, name)
        if raw is None:  # removed meanwhile
            await self._move(name, due_at, None, None)
            return None
        schedule = Schedule.model_validate_json(raw)
        plan = plan_fire(schedule, due_at, now, self.grace_s)
        if plan.fire_at is None:
            if plan.missed:
                log.info("schedule.skipped", extra={"schedule": name, "due_at": due_at})
            await self._move(name, due_at, plan.next_at, None)
            return None
        key = fire_key(name, plan.fire_at)
        fields = intake_fields(schedule, plan.fire_at, key)
        await self.redis.xadd(
            keys.intake_stream, cast("Any", fields), maxlen=keys.intake_maxlen, approximate=True
        )
        fire = {"fire_at": plan.fire_at, "task_id": fields["task_id"], "key": key,
                "caught_up": plan.missed, "at": now}  # fmt: skip
        await self._move(name, due_at, plan.next_at, fire)
        log.info("schedule.fired", extra={"schedule": name, "task_id": fields["task_id"]})
        return fields["task_id"]

    async def _move(
        self, name: str, due_at: float, next_at: float | None, fire: dict[str, Any] | None
    ) -> bool:
        moved = await self._advance(
            keys=[keys.schedules_due_key, keys.schedule_fires_key],
            args=[name, repr(due_at), "" if next_at is None else repr(next_at),
                  json.dumps(fire) if fire else ""],
        )  # fmt: skip
        return bool(moved)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
