"""Schedules: cron and time zone validation, fire times, and what one look at a due schedule
fires (on time, missed and skipped, missed and caught up once)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
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


def test_an_impossible_cron_is_refused_as_never_firing() -> None:
    """A cron no date matches (30 February) says it never fires and how to fix it."""
    for cron in ("0 0 30 2 *", "0 0 31 4,6 *"):
        with pytest.raises(ValidationError, match=r"never fires: no date has a day of the month"):
            _schedule(cron=cron)
    assert _schedule(cron="0 0 29 2 *").next_fire_after(_at("2026-03-01T00:00:00")) == _at(
        "2028-02-29T00:00:00"
    )


# -- summer time: cronie's rule ------------------------------------------------------------


def _local(when: float, zone: str) -> str:
    return datetime.fromtimestamp(when, ZoneInfo(zone)).isoformat(timespec="minutes")


def _fires(schedule: Schedule, start: str, end: str) -> list[str]:
    """Every fire in (start, end], as local times with their offsets."""
    found, at = [], _at(start)
    while (at := schedule.next_fire_after(at)) <= _at(end):
        found.append(_local(at, schedule.timezone))
    return found


def test_a_daily_time_in_the_repeated_hour_fires_once() -> None:
    """The issue's case: 01:30 daily fires at 01:30 summer time, not again an hour later."""
    lisbon = _schedule(cron="30 1 * * *", timezone="Europe/Lisbon")
    assert _fires(lisbon, "2026-10-24T12:00:00", "2026-10-26T12:00:00") == [
        "2026-10-25T01:30+01:00",
        "2026-10-26T01:30+00:00",
    ]
    new_york = _schedule(cron="30 1 * * *", timezone="America/New_York")
    assert _fires(new_york, "2026-10-31T12:00:00", "2026-11-02T12:00:00") == [
        "2026-11-01T01:30-04:00",
        "2026-11-02T01:30-05:00",
    ]


def test_wildcard_schedules_keep_firing_in_the_repeated_hour() -> None:
    """A minute or hour field of `*` runs on the clock: the repeated hour's times fire again."""
    hourly = _schedule(cron="0 * * * *", timezone="Europe/Lisbon")
    assert _fires(hourly, "2026-10-24T23:30:00", "2026-10-25T02:30:00") == [
        "2026-10-25T01:00+01:00",
        "2026-10-25T01:00+00:00",
        "2026-10-25T02:00+00:00",
    ]
    quarterly = _schedule(cron="*/30 * * * *", timezone="Europe/Lisbon")
    assert _fires(quarterly, "2026-10-25T00:10:00", "2026-10-25T01:40:00") == [
        "2026-10-25T01:30+01:00",
        "2026-10-25T01:00+00:00",
        "2026-10-25T01:30+00:00",
    ]


def test_a_time_skipped_by_spring_forward_fires_at_the_change() -> None:
    """A fixed time the clocks jump over fires when they change; a wildcard one does not."""
    lisbon = _schedule(cron="30 1 * * *", timezone="Europe/Lisbon")  # 01:00 WET -> 02:00 WEST
    assert _fires(lisbon, "2026-03-28T12:00:00", "2026-03-30T12:00:00") == [
        "2026-03-29T02:00+01:00",
        "2026-03-30T01:30+01:00",
    ]
    twice = _schedule(cron="0,30 1 * * *", timezone="Europe/Lisbon")
    assert _fires(twice, "2026-03-28T12:00:00", "2026-03-29T12:00:00") == ["2026-03-29T02:00+01:00"]
    new_york = _schedule(cron="30 2 * * *", timezone="America/New_York")
    assert _fires(new_york, "2026-03-07T12:00:00", "2026-03-08T12:00:00") == [
        "2026-03-08T03:00-04:00"
    ]
    wildcard = _schedule(cron="30 * * * *", timezone="Europe/Lisbon")
    assert _fires(wildcard, "2026-03-29T00:00:00", "2026-03-29T02:00:00") == [
        "2026-03-29T00:30+00:00",
        "2026-03-29T02:30+01:00",
    ]


def _cronie(schedule: Schedule, start: float, end: float) -> list[float]:
    """What cronie fires in (start, end], minute by minute on the clock of the schedule's zone
    (cron.c: a fixed-time job runs once per wall-clock minute, and at a jump forward for every
    minute jumped over; a wildcard job runs at the minutes the clock shows)."""
    zone = ZoneInfo(schedule.timezone)
    minute, hour = schedule.cron.split()[:2]
    fixed = not (minute.startswith("*") or hour.startswith("*"))
    clock = lambda at: datetime.fromtimestamp(at, zone).replace(tzinfo=None)  # noqa: E731
    seen = {clock(at) for at in range(int(start) - 4 * 3600, int(start) + 60, 60)}
    fires = []
    for at in range(int(start) + 60, int(end) + 60, 60):
        now, before = clock(at), clock(at - 60)
        jumped = [before + timedelta(minutes=k) for k in range(1, (now - before) // MINUTE)]
        fire = croniter.match(schedule.cron, now) and not (fixed and now in seen)
        if fixed and any(croniter.match(schedule.cron, w) for w in jumped):
            fire = True
        seen.add(now)
        if fire:
            fires.append(float(at))
    return fires


MINUTE = timedelta(minutes=1)


@pytest.mark.parametrize(
    ("zone", "changes"),
    [
        ("Europe/Lisbon", ("2026-03-29T01:00:00", "2026-10-25T01:00:00")),
        ("America/New_York", ("2026-03-08T07:00:00", "2026-11-01T06:00:00")),
        ("Australia/Lord_Howe", ("2026-04-04T15:00:00", "2026-10-03T15:30:00")),  # 30 min
    ],
)
@pytest.mark.parametrize(
    "cron",
    ["30 1 * * *", "0,30 1-3 * * *", "45 2 * * *", "*/15 * * * *", "0 * * * *", "* 1 * * *",
     "30 * * * *", "0 */2 * * *", "10 1,2 * * 0"],
)  # fmt: skip
def test_fire_times_follow_cronies_rule_around_every_change(
    zone: str, changes: tuple[str, str], cron: str
) -> None:
    """Next and last fire times agree with a minute-by-minute run of cronie's rule over the
    day around each change of the clocks, in zones that move one hour or half an hour."""
    schedule = _schedule(cron=cron, timezone=zone)
    for change in changes:
        start, end = _at(change) - 6 * 3600, _at(change) + 6 * 3600
        expected = _cronie(schedule, start, end)
        found, at = [], start
        while (at := schedule.next_fire_after(at)) <= end:
            found.append(at)
        assert [_local(f, zone) for f in found] == [_local(e, zone) for e in expected]
        for now in range(int(expected[0]) if expected else int(end), int(end), 7 * 60):
            latest = max(f for f in expected if f <= now)
            assert schedule.last_fire_at_or_before(now) == latest, _local(now, zone)


def test_a_schedule_stored_before_overlap_existed_keeps_firing_every_time() -> None:
    """An upgrade changes no stored schedule's behaviour: one without ``overlap`` is read back
    as ``allow``; a stored ``overlap`` is kept; a new schedule defaults to ``skip``."""
    old = {"name": "nightly", "cron": "30 1 * * *", "task": {"goal": "g"}}
    assert Schedule.from_stored(json.dumps(old)).overlap == "allow"
    assert Schedule.from_stored(json.dumps({**old, "overlap": "queue"})).overlap == "queue"
    assert Schedule.model_validate(old).overlap == "skip"
