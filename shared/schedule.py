"""Schedules: a task submitted at the times of a cron expression, in a time zone.

This module is pure (no Redis): the wire model and the decision of what one check fires.
:mod:`coordinator.schedules` keeps schedules in Redis and fires them from every coordinator.

A fire at time ``t`` submits the task with the idempotency key ``schedule:{name}:{t}`` (UTC, ISO
8601) and a task id derived from it, so however many coordinators fire it, and however often a
coordinator that died mid-fire fires it again, the intake creates one task.

A fire is *missed* when no coordinator looked at the schedule within ``grace_s`` of its time
(everything was down). ``catch_up: skip`` runs nothing for missed fires and waits for the next
one; ``catch_up: once`` submits one task for all of them, stamped with the latest missed time.

Summer time follows cronie's rule (cron(8), "Daylight Saving Time and other time changes"). A
*fixed-time* schedule, one whose minute and hour fields both name values (``30 1 * * *``,
``0 9-17 * * 1-5``), fires once at a wall-clock time the fall-back night repeats (at its first
occurrence), and a time the spring-forward night skips fires at the moment the clocks change
(several skipped times fire once, then). A *wildcard* schedule, one whose minute or hour field
starts with ``*`` (``*/15 * * * *``, ``0 * * * *``, ``* 1 * * *``), runs on the clock as it is:
in the repeated hour it fires again, and the skipped times do not fire.

``overlap`` says what a fire does while the schedule's previous run is still going (the
coordinator decides, :mod:`coordinator.schedules`): ``allow`` submits it anyway (what a
schedule stored before ``overlap`` existed keeps doing), ``skip`` (the default) drops it,
``queue`` keeps one fire, the first that came due, and submits it when the run ends
(Temporal's ``BUFFER_ONE``); later fires while one waits are dropped.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter
from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.task_spec import AGENT_NAME_PATTERN

__all__ = [
    "DEFAULT_GRACE_S",
    "FirePlan",
    "Overlap",
    "Schedule",
    "fire_key",
    "fire_task_id",
    "plan_fire",
]

DEFAULT_GRACE_S = 60.0
"""A fire looked at later than this after its time counts as missed."""

CatchUp = Literal["skip", "once"]
Overlap = Literal["allow", "skip", "queue"]
"""What a fire does while the schedule's previous run is still going (module docstring)."""


class Schedule(BaseModel):
    """A named schedule: when (``cron`` in ``timezone``), what (a task's JSON data), what to do
    about fires missed while nothing ran (``catch_up``) and about a fire that comes while the
    previous run still goes (``overlap``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=AGENT_NAME_PATTERN)
    cron: str
    timezone: str = "UTC"
    catch_up: CatchUp = "skip"
    overlap: Overlap = "skip"
    task: dict[str, Any]
    paused: bool = False
    created_at: float = 0.0

    @classmethod
    def from_stored(cls, raw: str | bytes) -> Schedule:
        """A schedule read back from where it was stored. One stored before ``overlap``
        existed keeps what it did then: every fire is submitted (``allow``); new schedules
        default to ``skip``."""
        data = json.loads(raw)
        if isinstance(data, dict):
            data.setdefault("overlap", "allow")
        return cls.model_validate(data)

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        if len(value.split()) != 5 or not croniter.is_valid(value):
            raise ValueError(
                f"cron {value!r} is not a cron expression of five fields (minute hour "
                "day-of-month month day-of-week); e.g. '*/15 * * * *' for every 15 minutes"
            )
        try:
            croniter(value, datetime(2000, 1, 1)).get_next(datetime)
        except CroniterBadDateError:
            _minute, _hour, day, month, _weekday = value.split()
            raise ValueError(
                f"cron {value!r} never fires: no date has a day of the month {day!r} in the "
                f"month {month!r} (e.g. 30 February); choose a day that exists in those months"
            ) from None
        return value

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(
                f"timezone {value!r} is not a known IANA time zone; use a name such as "
                "'Europe/Lisbon' or 'UTC'"
            ) from exc
        return value

    @property
    def fixed_time(self) -> bool:
        """Whether the minute and hour fields both name values (cronie's fixed-time job), not
        ``*`` or ``*/n``: such a schedule fires once on a repeated wall-clock time."""
        minute, hour = self.cron.split()[:2]
        return not (minute.startswith("*") or hour.startswith("*"))

    def next_fire_after(self, when: float) -> float:
        """The first fire time strictly after ``when`` (epoch seconds)."""
        start = datetime.fromtimestamp(math.floor(when), ZoneInfo(self.timezone))
        return next(self._fires(croniter(self.cron, start).all_next(datetime)))

    def last_fire_at_or_before(self, when: float) -> float:
        """The latest fire time at or before ``when`` (epoch seconds)."""
        start = datetime.fromtimestamp(math.floor(when) + 1, ZoneInfo(self.timezone))
        return next(self._fires(croniter(self.cron, start).all_prev(datetime)))

    def _fires(self, candidates: Iterator[datetime]) -> Iterator[float]:
        """croniter's times in the zone, less those cronie's summer-time rule does not fire.

        croniter gives both occurrences of a repeated time, and a skipped time as the moment
        the clocks change; a wildcard schedule does not fire at that moment unless the clock
        there matches, and a fixed-time one does not fire at the second occurrence.
        """
        zone = ZoneInfo(self.timezone)
        fixed = self.fixed_time
        for candidate in candidates:
            at = candidate.timestamp()
            clock = datetime.fromtimestamp(at, zone).replace(tzinfo=None)
            if not croniter.match(self.cron, clock):  # a skipped time, fired at the change
                if fixed:
                    yield at
                continue
            if fixed and clock.replace(tzinfo=zone, fold=0).timestamp() < at:
                continue  # the second occurrence of a repeated time
            yield at

    def fire_task(self, fire_at: float, key: str) -> dict[str, Any]:
        """The task data one fire submits: the schedule's task, its idempotency key, and the
        schedule's name and fire time in ``metadata``."""
        metadata = {
            **dict(self.task.get("metadata") or {}),
            "schedule": self.name,
            "schedule_fire_at": _iso(fire_at),
        }
        return {**self.task, "idempotency_key": key, "metadata": metadata}


@dataclass(frozen=True, slots=True)
class FirePlan:
    """What one look at a due schedule does: submit ``fire_at`` (None: nothing) and wait for
    ``next_at``; ``missed`` when fires went by unlooked at."""

    fire_at: float | None
    next_at: float
    missed: bool


def plan_fire(
    schedule: Schedule, due_at: float, now: float, grace_s: float = DEFAULT_GRACE_S
) -> FirePlan:
    """Decide a look at ``now`` at a schedule whose next fire was ``due_at``."""
    latest = schedule.last_fire_at_or_before(now)
    if latest < due_at:  # not due yet: a clock behind the one that set due_at
        return FirePlan(fire_at=None, next_at=due_at, missed=False)
    on_time = now - latest <= grace_s
    missed = latest > due_at or not on_time
    fire_at = latest if on_time or schedule.catch_up == "once" else None
    return FirePlan(fire_at=fire_at, next_at=schedule.next_fire_after(now), missed=missed)


def fire_key(name: str, fire_at: float, kind: str = "") -> str:
    """The idempotency key of one fire: ``schedule:{name}:{UTC time}`` (``kind`` tells a manual
    run, ``schedule:{name}:run:{time}``)."""
    middle = f"{kind}:" if kind else ""
    return f"schedule:{name}:{middle}{_iso(fire_at)}"


def fire_task_id(key: str) -> str:
    """The task id of a fire: the same for every submission of one fire."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"orga-queue:{key}").hex


def _iso(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds")
