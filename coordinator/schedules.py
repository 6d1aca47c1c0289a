"""Schedules in Redis: the book the CLI edits, and the scheduler every coordinator runs.

Keys (:mod:`shared.keys`): ``orga:{schedules}`` (name -> schedule JSON), ``orga:{schedules}:due``
(active schedules by their next fire time; a paused schedule is not in it),
``orga:{schedules}:fired`` (name -> the last fire: the schedule's last run, ``orga schedule run``'s
too) and ``orga:{schedules}:queued`` (name -> the one fire waiting for that run to end).

Firing is safe with any number of coordinators. Each looks at the schedules that are due, submits
the fire to the intake stream with the fire's idempotency key and task id
(:func:`shared.schedule.fire_key`), and only then moves the schedule's due time forward with a
compare-and-set: a coordinator that crashed in between leaves the schedule due, the next look
submits the same fire again, and the intake's idempotency makes both one task. Two coordinators
looking at once submit the same fire twice, and again the intake keeps one.

Overlap (``Schedule.overlap``). Before submitting a fire of a schedule whose policy is not
``allow``, the scheduler asks whether the schedule's last run is still going: its task is active
(in ``orga:{p:NN}:tasks:deadlines``, which holds a task from its creation to its end), or it is
not a task yet because its intake entry is still unread or being read (an entry rejected, or
acknowledged as a duplicate, has nothing running). If so,
``skip`` drops the fire and ``queue`` keeps it in ``orga:{schedules}:queued`` unless a fire waits
there already (one is kept: the first), both in the compare-and-set that moves the due time, so
one coordinator decides. Every look also submits the queued fires whose run has ended, under
their own fire's key, so two coordinators releasing one make one task.
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
from redis.exceptions import ResponseError

from coordinator.streams import is_cluster
from shared import keys
from shared.errors import OrgaError
from shared.schedule import (
    DEFAULT_GRACE_S,
    FirePlan,
    Schedule,
    fire_key,
    fire_task_id,
    plan_fire,
)

__all__ = [
    "ScheduleBook",
    "ScheduleExistsError",
    "ScheduleNotFoundError",
    "ScheduleView",
    "Scheduler",
    "adopt_legacy_schedules",
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
    """A schedule as ``orga schedule list`` shows it: ``queued`` is the fire waiting for the
    last run to end (``overlap: queue``)."""

    schedule: Schedule
    next_at: float | None
    last_fire: dict[str, Any] | None
    queued: dict[str, Any] | None = None


@dataclass
class ScheduleBook:
    """Add, pause, resume, remove and run schedules (the ``orga schedule`` commands)."""

    redis: redis.Redis
    clock: Callable[[], float] = time.time
    partitions: int | None = None
    """The deployment's partition count (None: the one stored in Redis): a run goes to its
    task's partition's intake."""

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
        return Schedule.from_stored(raw)

    def views(self) -> list[ScheduleView]:
        """Every schedule with its next fire time and its last fire, by name."""
        raw = cast("dict[str, str]", self.redis.hgetall(keys.schedules_key))
        schedules = sorted((Schedule.from_stored(v) for v in raw.values()), key=lambda s: s.name)
        names = [s.name for s in schedules]
        due = self.redis.zmscore(keys.schedules_due_key, names) if names else []
        fired = cast(
            "list[str | None]", self.redis.hmget(keys.schedule_fires_key, names) if names else []
        )
        queued = cast(
            "list[str | None]", self.redis.hmget(keys.schedules_queued_key, names) if names else []
        )
        return [
            ScheduleView(s, d, json.loads(f) if f else None, json.loads(q) if q else None)
            for s, d, f, q in zip(schedules, due, fired, queued, strict=True)
        ]

    def pause(self, name: str) -> None:
        """Stop firing ``name`` (its fires until resumed are not run, nor the queued one)."""
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
                pipe.hdel(keys.schedules_queued_key, name)
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
        pipe.hdel(keys.schedules_queued_key, name)
        removed, *_ = pipe.execute()
        if not removed:
            self.get(name)  # raises, naming the known ones

    def run_now(self, name: str) -> str:
        """Submit ``name``'s task now (paused or not, whatever its overlap policy); returns the
        task id. The run is the schedule's last run, which the next fire's overlap looks at."""
        schedule = self.get(name)
        now = self.clock()
        key = fire_key(name, now, kind="run")
        fields = intake_fields(schedule, now, key)
        count = self.partitions or int(cast("str", self.redis.get(keys.partitions_key) or 1))
        entry = self.redis.xadd(
            keys.intake_stream(keys.partition_of(fields["task_id"], count)),
            cast("Any", fields), maxlen=keys.intake_maxlen, approximate=True,
        )  # fmt: skip
        fire = _fire_record(now, fields["task_id"], key, _text(entry), now, run=True)
        self.redis.hset(keys.schedule_fires_key, name, json.dumps(fire))
        return fields["task_id"]


def _fire_record(
    fire_at: float, task_id: str, key: str, entry: str, now: float, **flags: bool
) -> dict[str, Any]:
    """What ``orga:{schedules}:fired`` keeps of a fire (``entry``: its intake entry's id)."""
    return {"fire_at": fire_at, "task_id": task_id, "key": key, "entry": entry, "at": now,
            "caught_up": False, **flags}  # fmt: skip


# Move a schedule's due time from the time this look saw to the next one, and record the fire
# (or queue it behind the running one, if none waits yet: 2), unless another coordinator moved
# it first or the schedule was paused or removed (ZREM): 0.
_ADVANCE = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then return 0 end
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
end
if ARGV[4] ~= '' then redis.call('HSET', KEYS[2], ARGV[1], ARGV[4]) end
if ARGV[5] ~= '' and redis.call('HSETNX', KEYS[3], ARGV[1], ARGV[5]) == 1 then return 2 end
return 1
"""

# Take a queued fire out (if it is still the one this look saw) and record it as the last fire.
_RELEASE = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[2], ARGV[1], ARGV[3]) end
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
    partitions: int = 1
    """The deployment's partition count: a fire goes to its task's partition's intake."""
    _advance: Any = field(init=False, repr=False)
    _release: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._advance = self.redis.register_script(_ADVANCE)
        self._release = self.redis.register_script(_RELEASE)

    async def fire_due(self) -> list[str]:
        """Submit the queued fires whose run has ended, then look at every due schedule once;
        the task ids this look submitted."""
        now = self.clock()
        submitted = await self._release_queued(now)
        due = cast(
            "list[tuple[Any, float]]",
            await self.redis.zrangebyscore(
                keys.schedules_due_key, "-inf", now, start=0, num=self.batch, withscores=True
            ),
        )
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
        schedule = Schedule.from_stored(raw)
        plan = plan_fire(schedule, due_at, now, self.grace_s)
        if plan.fire_at is None:
            if plan.missed:
                log.info("schedule.skipped", extra={"schedule": name, "due_at": due_at})
            await self._move(name, due_at, plan.next_at, None)
            return None
        running = None if schedule.overlap == "allow" else await self._running(name)
        # the last fire may be this one: a look again after a crash before the advance
        if running is not None and running.get("key") != fire_key(name, plan.fire_at):
            await self._hold(schedule, due_at, plan, running, now)
            return None
        task_id, fire = await self._submit(schedule, plan.fire_at, now, caught_up=plan.missed)
        await self._move(name, due_at, plan.next_at, fire)
        log.info("schedule.fired", extra={"schedule": name, "task_id": task_id})
        return task_id

    async def _submit(
        self, schedule: Schedule, fire_at: float, now: float, **flags: bool
    ) -> tuple[str, dict[str, Any]]:
        """Put one fire on the intake; its task id and the record of the fire."""
        key = fire_key(schedule.name, fire_at)
        fields = intake_fields(schedule, fire_at, key)
        entry = await self.redis.xadd(
            keys.intake_stream(keys.partition_of(fields["task_id"], self.partitions)),
            cast("Any", fields), maxlen=keys.intake_maxlen, approximate=True,
        )  # fmt: skip
        task_id = fields["task_id"]
        return task_id, _fire_record(fire_at, task_id, key, _text(entry), now, **flags)

    async def _hold(
        self, schedule: Schedule, due_at: float, plan: FirePlan, running: dict[str, Any],
        now: float,
    ) -> None:  # fmt: skip
        """A fire while the last run goes: dropped (``skip``), or queued behind the run
        (``queue``) unless a fire waits already."""
        wait = {"fire_at": plan.fire_at, "after": running["task_id"], "at": now}
        queue = schedule.overlap == "queue"
        moved = await self._move(schedule.name, due_at, plan.next_at, None, wait if queue else None)
        if moved:
            event = "schedule.overlap_queued" if moved == 2 else "schedule.overlap_skipped"
            log.info(event, extra={"schedule": schedule.name, "fire_at": plan.fire_at,
                                   "running_task_id": running["task_id"]})  # fmt: skip

    async def _release_queued(self, now: float) -> list[str]:
        """Submit each queued fire whose schedule's last run has ended."""
        waiting = cast("dict[Any, Any]", await self.redis.hgetall(keys.schedules_queued_key))
        submitted = []
        for raw_name, raw_wait in waiting.items():
            name, text = _text(raw_name), _text(raw_wait)
            if await self._running(name) is not None:
                continue
            raw = await self.redis.hget(keys.schedules_key, name)
            if raw is None:  # removed meanwhile
                await self._release(keys=[keys.schedules_queued_key, keys.schedule_fires_key],
                                    args=[name, text, ""])  # fmt: skip
                continue
            schedule = Schedule.from_stored(raw)
            fire_at = float(json.loads(text)["fire_at"])
            task_id, fire = await self._submit(schedule, fire_at, now, queued=True)
            await self._release(keys=[keys.schedules_queued_key, keys.schedule_fires_key],
                                args=[name, text, json.dumps(fire)])  # fmt: skip
            log.info("schedule.fired", extra={"schedule": name, "task_id": task_id})
            submitted.append(task_id)
        return submitted

    async def _running(self, name: str) -> dict[str, Any] | None:
        """The schedule's last fire if its run is still going, else None."""
        raw = await self.redis.hget(keys.schedule_fires_key, name)
        if raw is None:
            return None
        fire = cast("dict[str, Any]", json.loads(raw))
        task_id = fire["task_id"]
        p = keys.partition_of(task_id, self.partitions)
        pipe = self.redis.pipeline(transaction=False)
        pipe.zscore(keys.deadlines_key(p), task_id)  # a score: not ended
        pipe.exists(keys.task_key(task_id, p))
        active, exists = await pipe.execute()
        if active is not None:
            return fire
        if exists:  # a task that ended
            return None
        return fire if await self._unread(str(fire.get("entry") or ""), p) else None

    async def _unread(self, entry: str, partition: int) -> bool:
        """Whether the intake entry (of ``partition``'s intake) is still to be read or being
        read by the coordinators (an entry read to the end is acknowledged: its task was
        created, or it was rejected)."""
        intake = keys.intake_stream(partition)
        if not entry or not await self.redis.xrange(intake, entry, entry, count=1):
            return False  # trimmed away: no coordinator will read it
        try:
            groups = await self.redis.xinfo_groups(intake)
        except ResponseError:
            return True
        group = next((g for g in groups if _text(g["name"]) == keys.coordinator_group), None)
        if group is None or _entry_id(entry) > _entry_id(_text(group["last-delivered-id"])):
            return True
        pending = await self.redis.xpending_range(
            intake, keys.coordinator_group, min=entry, max=entry, count=1
        )
        return bool(pending)

    async def _move(
        self, name: str, due_at: float, next_at: float | None, fire: dict[str, Any] | None,
        wait: dict[str, Any] | None = None,
    ) -> int:  # fmt: skip
        """0: another coordinator moved it first; 1: moved; 2: moved, and ``wait`` queued."""
        moved = await self._advance(
            keys=[keys.schedules_due_key, keys.schedule_fires_key, keys.schedules_queued_key],
            args=[name, repr(due_at), "" if next_at is None else repr(next_at),
                  json.dumps(fire) if fire else "", json.dumps(wait) if wait else ""],
        )  # fmt: skip
        return int(moved)


async def adopt_legacy_schedules(redis: AsyncRedis) -> int:
    """Rename the schedules' keys of a deployment from before their ``{schedules}`` hash tag
    (``orga:schedules`` → ``orga:{schedules}``, and the others of
    :data:`shared.keys.legacy_schedule_keys`), unless the new key exists; how many were
    renamed. A Redis Cluster never held the old names (it was not supported then)."""
    renamed = 0
    if is_cluster(redis):
        return renamed
    for old, new in keys.legacy_schedule_keys.items():
        if await redis.exists(old):
            renamed += int(await redis.renamenx(old, new))
    if renamed:
        log.warning("schedules.keys_renamed", extra={"renamed": renamed})
    return renamed


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _entry_id(entry: str) -> tuple[int, int]:
    """A stream entry id (``ms-seq``) in the order Redis gives them."""
    ms, _, seq = entry.partition("-")
    return int(ms), int(seq or 0)
