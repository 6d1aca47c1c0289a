"""``orga schedule add | list | pause | resume | remove | run``: tasks submitted on a cron.

The coordinators fire the schedules (:mod:`coordinator.schedules`); these commands only edit
them in Redis, except ``run``, which submits the task now.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar
from zoneinfo import ZoneInfo

import typer
from pydantic import ValidationError
from rich.table import Table
from rich.text import Text

from coordinator.client import task_text
from coordinator.schedules import ScheduleBook, ScheduleExistsError, ScheduleNotFoundError
from orga.cli_runtime import fail, out, say, with_redis
from shared.schedule import Schedule
from shared.task_spec import TaskSpecError, describe_validation_error, load_task_file

__all__ = ["schedule_app"]

T = TypeVar("T")

schedule_app = typer.Typer(
    help="Tasks submitted on a cron schedule by the coordinators.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

ScheduleName = Annotated[str, typer.Argument(metavar="NAME", help="A schedule's name.")]


@schedule_app.command("add")
def schedule_add(  # noqa: PLR0917 (a Typer command: one parameter per option)
    name: ScheduleName,
    task_file: Annotated[Path, typer.Argument(metavar="TASK_FILE", help="A YAML or JSON task.")],
    cron: Annotated[
        str, typer.Option("--cron", metavar="EXPR", help="Five cron fields, e.g. '*/15 * * * *'.")
    ],
    timezone: Annotated[
        str, typer.Option("--timezone", metavar="ZONE", help="IANA zone of the cron times.")
    ] = "UTC",
    catch_up: Annotated[
        str,
        typer.Option(
            "--catch-up",
            metavar="skip|once",
            help="Fires missed while nothing ran: skip them, or run the task once for them.",
        ),
    ] = "skip",
    overlap: Annotated[
        str,
        typer.Option(
            "--overlap",
            metavar="allow|skip|queue",
            help="A fire while the last run still goes: run it anyway, skip it, or queue one "
            "to run when the last run ends.",
        ),
    ] = "skip",
) -> None:
    """Submit TASK_FILE at every time of the cron expression."""
    schedule = _schedule(name, task_file, {"cron": cron, "timezone": timezone,
                                           "catch_up": catch_up, "overlap": overlap})  # fmt: skip
    try:
        first = with_redis(lambda r: ScheduleBook(r).add(schedule))
    except ScheduleExistsError as exc:
        raise fail("error:", exc, 1) from exc
    say(f"schedule {name} added; first fire at {_when(first, schedule)}")


def _schedule(name: str, task_file: Path, when: dict[str, str]) -> Schedule:
    try:
        task = json.loads(task_text(load_task_file(task_file)))
        return Schedule.model_validate(
            {"name": name, **when, "task": task, "created_at": time.time()}
        )
    except TaskSpecError as exc:
        raise fail("invalid task:", exc, 2) from exc
    except ValidationError as exc:
        raise fail("invalid schedule:", describe_validation_error(exc), 2) from exc


@schedule_app.command("list")
def schedule_list(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Every schedule: its cron, policies, state, next fire, last fire and queued fire."""
    views = with_redis(lambda r: ScheduleBook(r).views())
    if as_json:
        rows: list[dict[str, Any]] = [
            {**v.schedule.model_dump(exclude={"task"}), "goal": v.schedule.task.get("goal"),
             "next_at": v.next_at, "last_fire": v.last_fire, "queued": v.queued}
            for v in views
        ]  # fmt: skip
        out.print_json(json.dumps(rows))
        return
    table = Table("schedule", "cron", "timezone", "catch-up", "overlap", "state", "next fire",
                  "last task", "queued fire")  # fmt: skip
    for v in views:
        s = v.schedule
        last = v.last_fire["task_id"] if v.last_fire else "-"
        queued = _when(v.queued["fire_at"], s) if v.queued else "-"
        cells = (s.name, s.cron, s.timezone, s.catch_up, s.overlap,
                 "paused" if s.paused else "active",
                 _when(v.next_at, s) if v.next_at else "-", last, queued)  # fmt: skip
        table.add_row(*(Text(cell) for cell in cells))
    out.print(table)


@schedule_app.command("pause")
def schedule_pause(name: ScheduleName) -> None:
    """Stop firing a schedule until it is resumed."""
    _edit(lambda book: book.pause(name))
    say(f"schedule {name} paused")


@schedule_app.command("resume")
def schedule_resume(name: ScheduleName) -> None:
    """Fire a paused schedule again, from its next time (fires while paused are not run)."""
    upcoming = _edit(lambda book: book.resume(name))
    say(f"schedule {name} resumed; next fire at {_iso(upcoming)}")


@schedule_app.command("remove")
def schedule_remove(name: ScheduleName) -> None:
    """Delete a schedule (the tasks it submitted stay)."""
    _edit(lambda book: book.remove(name))
    say(f"schedule {name} removed")


@schedule_app.command("run")
def schedule_run(name: ScheduleName) -> None:
    """Submit the schedule's task now; prints the task id."""
    task_id = _edit(lambda book: book.run_now(name))
    say(task_id)


def _edit(body: Callable[[ScheduleBook], T]) -> T:
    try:
        return with_redis(lambda r: body(ScheduleBook(r)))
    except ScheduleNotFoundError as exc:
        raise fail("error:", exc, 1) from exc


def _when(at: float, schedule: Schedule) -> str:
    return datetime.fromtimestamp(at, ZoneInfo(schedule.timezone)).isoformat(timespec="minutes")


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at).astimezone().isoformat(timespec="minutes")
