"""Schedules: cron and time zone validation, fire times, and what one look at a due schedule
fires (on time, missed and skipped, missed and caught up once)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from shared.schedule import Schedule, fire_key, fire_task_id, plan_fire


def _at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def _schedule(**fields: object) -> Schedule:
    data: dict[str, object] = {"name": "nightly", "cron": "*/15 * * * *", "task": {"goal": "g"}}
    data.update(fields)
    return Schedule.model_validate(data)


def test_a_bad_cron_expression_is_refused_with_an_example() -> None:
    """A cron of the wrong shape names the value and shows a valid one."""
    for cron in ("61 * * * *", "* * * *", "* * * * * *", "every minute"):
        with pytest.raises(ValidationError, match=r"not a cron expression of five fields"):
            _schedule(cron=cron)


def test_an_unknown_time_zone_is_refused() -> None:
    """A misspelt zone names the value and a valid example."""
    with pytest.raises(ValidationError, match=r"'Europe/Lisboa' is not a known IANA time zone"):
        _schedule(timezone="Europe/Lisboa")


def test_a_typo_in_catch_up_is_refused() -> None:
    """catch_up is skip or once."""
    with pytest.raises(ValidationError, match="catch_up"):
        _schedule(catch_up="twice")


def test_fire_times_follow_the_cron_in_its_time_zone() -> None:
    """Next and last fire times are whole cron times, in the schedule's zone."""
    daily = _schedule(cron="0 9 * * *", timezone="Europe/Lisbon")
    # 3 December: Lisbon is on UTC (WET), so 09:00 Lisbon is 09:00 UTC.
    assert daily.next_fire_after(_at("2026-12-03T08:00:00")) == _at("2026-12-03T09:00:00")
    # July: Lisbon is on UTC+1 (WEST), so 09:00 Lisbon is 08:00 UTC.
    assert daily.next_fire_after(_at("2026-07-01T07:00:00")) == _at("2026-07-01T08:00:00")
    quarter = _schedule()
    assert quarter.last_fire_at_or_before(_at("2026-12-03T10:15:00")) == _at("2026-12-03T10:15:00")
    assert quarter.last_fire_at_or_before(_at("2026-12-03T10:14:59")) == _at("2026-12-03T10:00:00")
    assert quarter.next_fire_after(_at("2026-12-03T10:15:00")) == _at("2026-12-03T10:30:00")


def test_a_due_fire_looked_at_in_time_fires() -> None:
    """Looked at within the grace period, the due fire is submitted; next is the one after."""
    plan = plan_fire(_schedule(), _at("2026-12-03T10:15:00"), _at("2026-12-03T10:15:02"))
    assert plan.fire_at == _at("2026-12-03T10:15:00")
    assert plan.next_at == _at("2026-12-03T10:30:00")
    assert not plan.missed


def test_not_yet_due_fires_nothing() -> None:
    """A clock behind the due time fires nothing and keeps the due time."""
    due = _at("2026-12-03T10:15:00")
    plan = plan_fire(_schedule(), due, _at("2026-12-03T10:14:58"))
    assert plan.fire_at is None
    assert plan.next_at == due


def test_missed_fires_are_skipped_with_skip() -> None:
    """After an outage, skip submits nothing and waits for the next fire after now."""
    plan = plan_fire(_schedule(), _at("2026-12-03T10:15:00"), _at("2026-12-03T11:07:00"))
    assert plan.fire_at is None
    assert plan.missed
    assert plan.next_at == _at("2026-12-03T11:15:00")


def test_missed_fires_are_caught_up_once_with_once() -> None:
    """After an outage, once submits one task, stamped with the latest missed fire."""
    schedule = _schedule(catch_up="once")
    plan = plan_fire(schedule, _at("2026-12-03T10:15:00"), _at("2026-12-03T11:07:00"))
    assert plan.fire_at == _at("2026-12-03T11:00:00")
    assert plan.missed
    assert plan.next_at == _at("2026-12-03T11:15:00")


def test_with_skip_a_current_fire_still_runs_after_missed_ones() -> None:
    """Fires missed before the one just due are skipped, the one in time still runs."""
    plan = plan_fire(_schedule(), _at("2026-12-03T10:15:00"), _at("2026-12-03T11:00:10"))
    assert plan.fire_at == _at("2026-12-03T11:00:00")
    assert plan.missed


def test_a_fire_has_one_key_and_one_task_id() -> None:
    """The key is the name and the UTC fire time; the task id is derived from it."""
    key = fire_key("nightly", _at("2026-12-03T10:15:00"))
    assert key == "schedule:nightly:2026-12-03T10:15:00.000+00:00"
    assert fire_task_id(key) == fire_task_id(fire_key("nightly", _at("2026-12-03T10:15:00")))
    assert fire_task_id(key) != fire_task_id(fire_key("nightly", _at("2026-12-03T10:30:00")))
    assert fire_key("n", 0.0, kind="run") == "schedule:n:run:1970-01-01T00:00:00.000+00:00"


def test_a_fire_submits_the_task_with_its_key_and_schedule_metadata() -> None:
    """The fired task carries the idempotency key and says which schedule and time fired it."""
    schedule = _schedule(task={"goal": "g", "metadata": {"team": "ops"}, "idempotency_key": "x"})
    task = schedule.fire_task(_at("2026-12-03T10:15:00"), "k")
    assert task["idempotency_key"] == "k"
    assert task["metadata"] == {
        "team": "ops",
        "schedule": "nightly",
        "schedule_fire_at": "2026-12-03T10:15:00.000+00:00",
    }
