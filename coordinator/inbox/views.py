"""What the inbox's pages show, read through :class:`OrgaClient` and shaped for the templates.

Plain frozen records; the templates escape every string in them (Jinja2 autoescape).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from coordinator.client import OrgaClient, TaskNotFoundError
from coordinator.inbox.timeline import Block, describe, human_duration
from coordinator.state import ReviewItem, StepStatus, TaskRecord
from shared.events import JournalEntry

__all__ = [
    "CriticView",
    "HeldCallView",
    "JournalRow",
    "ParentContext",
    "RecentMessage",
    "ReviewCard",
    "TaskRow",
    "journal_rows",
    "review_cards",
    "task_rows",
    "utc",
]

JOURNAL_TAIL = 200
"""How many of a task's last journal entries its page shows."""


def utc(timestamp: float) -> str:
    """A Unix time as ``2026-12-03 07:30:12 UTC``."""
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True, slots=True)
class RecentMessage:
    """One of the last messages before the escalation: an action, a result or a reply."""

    role: str
    content: str
    tool: str
    tool_calls: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CriticView:
    """A step's result before its critic: what a human critic (or the reviewer of a critic's
    escalation) decides on."""

    critic: str
    rubric: str
    result: str
    done_when: str | None
    done_when_output: str | None
    round: int
    max_rounds: int
    verdicts: tuple[tuple[str, str, str], ...]
    """``(verdict, reason, decided_by)``, oldest first."""


@dataclass(frozen=True, slots=True)
class HeldCallView:
    """A tool call held for a reviewer: what it would run, and the arguments as editable JSON."""

    tool: str
    call_id: str
    arguments: str
    """The proposed arguments, indented JSON (the edit form starts from them)."""
    fields: tuple[tuple[str, str, bool], ...]
    """``(name, JSON type, required)`` of each property the tool's input schema declares."""


@dataclass(frozen=True, slots=True)
class ReviewCard:
    """An open review with the context a reviewer decides on."""

    review_id: str
    task_id: str
    step_id: str
    source: str
    reason: str
    created: str
    deadline: str
    default_decision: str
    goal: str
    instruction: str
    iteration: int
    attempts: int
    counters: tuple[tuple[str, str], ...]
    last_milestone: str | None
    recent: tuple[RecentMessage, ...]
    parent: ParentContext | None = None
    """For a sub-agent's review: the parent task, its goal and the step that delegated."""
    critic: CriticView | None = None
    call: HeldCallView | None = None
    """For a review of one held tool call (source ``call``)."""


@dataclass(frozen=True, slots=True)
class ParentContext:
    """What a reviewer of a sub-agent sees of the task that created it."""

    task_id: str
    goal: str
    step_id: str
    instruction: str


def review_cards(items: list[ReviewItem]) -> list[ReviewCard]:
    """Open reviews, newest first, with their snapshot unpacked."""
    return [_card(item) for item in sorted(items, key=lambda r: r.created_at, reverse=True)]


def _card(item: ReviewItem) -> ReviewCard:
    snapshot = item.snapshot
    step: dict[str, Any] = snapshot.get("step") or {}
    milestones = list(snapshot.get("milestones") or [])
    counters: dict[str, Any] = snapshot.get("counters") or {}
    return ReviewCard(
        review_id=item.review_id,
        task_id=item.task_id,
        step_id=item.step_id,
        source=item.source,
        reason=item.reason,
        created=utc(item.created_at),
        deadline=utc(item.deadline),
        default_decision=item.default_decision,
        goal=str(snapshot.get("goal", "")),
        instruction=str(step.get("instruction", "")),
        iteration=int(snapshot.get("iteration", 0)),
        attempts=int(snapshot.get("attempts", 0)),
        counters=tuple((str(k), str(v)) for k, v in counters.items()),
        last_milestone=str(milestones[-1]) if milestones else None,
        recent=tuple(_recent(m) for m in snapshot.get("recent") or []),
        critic=_critic(snapshot.get("critic")),
        parent=_parent(snapshot.get("parent")),
        call=_held_call(item),
    )


def _held_call(item: ReviewItem) -> HeldCallView | None:
    call = item.call
    if call is None:
        return None
    try:
        shown = json.dumps(call.parsed_arguments(), indent=2, ensure_ascii=False)
    except ValueError:
        shown = call.arguments
    schema = item.input_schema or {}
    properties: dict[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    fields = tuple(
        (str(name), str((spec or {}).get("type", "any")), name in required)
        for name, spec in properties.items()
    )
    return HeldCallView(tool=call.name, call_id=call.call_id, arguments=shown, fields=fields)


def _parent(data: Any) -> ParentContext | None:
    if not isinstance(data, dict):
        return None
    step: dict[str, Any] = data.get("step") or {}
    return ParentContext(
        task_id=str(data.get("task_id", "")),
        goal=str(data.get("goal", "")),
        step_id=str(step.get("id", "")),
        instruction=str(step.get("instruction", "")),
    )


def _critic(payload: Any) -> CriticView | None:
    if not isinstance(payload, dict):
        return None
    verdicts = payload.get("verdicts") or []
    return CriticView(
        critic=str(payload.get("critic", "")),
        rubric=str(payload.get("rubric", "")),
        result=str(payload.get("result", "")),
        done_when=_optional(payload.get("done_when")),
        done_when_output=_optional(payload.get("done_when_output")),
        round=int(payload.get("round", 1)),
        max_rounds=int(payload.get("max_rounds", 0)),
        verdicts=tuple(
            (str(v.get("verdict", "")), str(v.get("reason", "")), str(v.get("decided_by", "")))
            for v in verdicts
            if isinstance(v, dict)
        ),
    )


def _optional(value: Any) -> str | None:
    return None if value is None else str(value)


def _recent(message: dict[str, Any]) -> RecentMessage:
    return RecentMessage(
        role=str(message.get("role", "")),
        content=str(message.get("content", "")),
        tool=str(message.get("tool", "")),
        tool_calls=tuple(str(c) for c in message.get("tool_calls") or []),
    )


@dataclass(frozen=True, slots=True)
class TaskRow:
    """A task's live status and progress."""

    task_id: str
    status: str
    goal: str
    step: str
    steps_done: int
    steps_total: int
    iteration: int
    review_id: str | None


def task_rows(client: OrgaClient, limit: int = 50) -> list[TaskRow]:
    """The most recent tasks, newest first (one purged meanwhile is left out)."""
    rows = []
    for listed in client.list_tasks(limit):
        try:
            rows.append(task_row(client.record(listed["task_id"])))
        except TaskNotFoundError:
            continue
    return rows


def task_row(record: TaskRecord) -> TaskRow:
    """A task's status and progress, as ``orga status ID`` shows them."""
    return TaskRow(
        task_id=record.task_id,
        status=record.status.value,
        goal=record.spec.goal,
        step=record.steps[record.current].spec.id if record.steps else "",
        steps_done=sum(1 for s in record.steps if s.status is StepStatus.COMPLETED),
        steps_total=len(record.steps),
        iteration=record.iteration,
        review_id=record.review.review_id if record.review else None,
    )


@dataclass(frozen=True, slots=True)
class JournalRow:
    """A journal entry as one line of the task's timeline: when (and how long after the entry
    before it), where, what, in words (:mod:`coordinator.inbox.timeline`), and the longer
    texts behind it."""

    sequence: int
    time: str
    since: str
    step: str
    iteration: int
    event: str
    detail: str
    blocks: tuple[Block, ...] = ()


def journal_rows(client: OrgaClient, task_id: str, journal_seq: int) -> list[JournalRow]:
    """The task's last :data:`JOURNAL_TAIL` journal entries, oldest first."""
    after = max(-1, journal_seq - JOURNAL_TAIL - 1)
    entries = client.journal(task_id, after=after)
    previous = [None, *entries][: len(entries)]
    return [_journal_row(e, before) for e, before in zip(entries, previous, strict=True)]


def _journal_row(entry: JournalEntry, before: JournalEntry | None = None) -> JournalRow:
    detail, blocks = describe(entry.event)
    gap = (entry.timestamp - before.timestamp) if before is not None else None
    return JournalRow(
        sequence=entry.sequence,
        time=entry.timestamp.strftime("%H:%M:%S"),
        since=f"+{human_duration(gap)}" if gap is not None and gap.total_seconds() > 0 else "",
        step=entry.step_id or "",
        iteration=entry.iteration,
        event=entry.event.type,
        detail=detail,
        blocks=blocks,
    )
