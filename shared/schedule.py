"""Schedules: a task submitted at the times of a cron expression, in a time zone.

This module is pure (no Redis): the wire model and the decision of what one check fires.
:mod:`coordinator.schedules` keeps schedules in Redis and fires them from every coordinator.

A fire at time ``t`` submits the task with the idempotency key ``schedule:{name}:{t}`` (UTC, ISO
8601) and a task id derived from it, so however many coordinators fire it, and however often a
coordinator that died mid-fire fires it again, the intake creates one task.

A fire is *missed* when no coordinator looked at the schedule within ``grace_s`` of its time
(everything was down). ``catch_up: skip`` runs nothing for missed fires and waits for the next
one; ``catch_up: once`` submits one task for all of them, stamped with the latest missed time.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.task_spec import AGENT_NAME_PATTERN

__all__ = [
    "DEFAULT_GRACE_S",
    "FirePlan",
    "Schedule",
    "fire_key",
    "fire_task_id",
    "plan_fire",
]

DEFAULT_GRACE_S = 60.0
"""A fire looked at later than this after its time counts as missed."""

CatchUp = Literal["skip", "once"]


class Schedule(BaseModel):
    """A named schedule: when (``cron`` in ``timezone``), what (a task's JSON data), and what to
    do about fires missed while nothing ran (``catch_up``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=AGENT_NAME_PATTERN)
    cron: str
    timezone: str = "UTC"
    catch_up: CatchUp = "skip"
    task: dict[str, Any]
    paused: bool = False
    created_at: float = 0.0

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        if len(value.split()) != 5 or not croniter.is_valid(value):
            raise ValueError(
                f"cron {value!r} is not a cron expression of five fields (minute hour "
                "day-of-month month day-of-week); e.g. '*/15 * * * *' for every 15 minutes"
            )
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

    def next_fire_after(self, when: float) -> float:
        """The first fire time strictly after ``when`` (epoch seconds)."""
        start = datetime.fromtimestamp(math.floor(when), ZoneInfo(self.timezone))
        return float(croniter(self.cron, start).get_next(datetime).timestamp())

    def last_fire_at_or_before(self, when: float) -> float:
        """The latest fire time at or before ``when`` (epoch seconds)."""
        start = datetime.fromtimestamp(math.floor(when) + 1, ZoneInfo(self.timezone))
        return float(croniter(self.cron, start).get_prev(datetime).timestamp())

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
