"""The persisted state of a task: everything needed to resume it after a coordinator crash."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared import keys
from shared.actions import Observation, ToolCallAction
from shared.approval import DecisionKind
from shared.conversation import Conversation, ConversationMessage
from shared.delegation import is_delegate
from shared.errors import OrgaError
from shared.inference import Usage
from shared.protocol import Fence
from shared.task_spec import StepSpec, TaskSpec

__all__ = [
    "RESERVED_REVIEWERS",
    "TERMINAL_STATUSES",
    "AwaitKind",
    "Awaiting",
    "ChildRef",
    "Outage",
    "ReviewDecision",
    "ReviewItem",
    "ReviewSource",
    "ReviewerError",
    "StepCritique",
    "StepRecord",
    "StepStatus",
    "TaskRecord",
    "TaskStatus",
    "check_reviewer",
]


class TaskStatus(StrEnum):
    """Where a task is in its life."""

    PENDING = "pending"
    PLANNING = "planning"
    RUNNING = "running"
    AWAITING_REVIEW = "awaiting_review"
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"


TERMINAL_STATUSES = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.ABORTED})


class StepStatus(StrEnum):
    """Where a step is."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    SKIPPED = "skipped"
    FAILED = "failed"


class StepCritique(BaseModel):
    """A step's result waiting for its critic, and the critic's rounds so far."""

    result: str
    verified: bool
    check_output: str | None = None
    """The ``done_when`` check's output (when the step has one; it passed)."""
    rounds: int = 0
    """Revisions sent back to the worker so far (the step's ``critic.max_rounds`` bounds it)."""
    rejected: int = 0
    """The critic's malformed replies in a row (the second escalates)."""
    last_error: str | None = None
    """Why the critic's last reply was refused (told to it when it is asked again)."""
    verdicts: list[dict[str, str]] = Field(default_factory=list)
    """``{"verdict", "reason", "decided_by"}`` of every verdict on this step, oldest first."""


class StepRecord(BaseModel):
    """A step and what became of it; ``verified`` means its ``done_when`` check passed."""

    spec: StepSpec
    status: StepStatus = StepStatus.PENDING
    output: str = ""
    verified: bool = False
    iterations: int = 0
    attempts: int = 0
    usage: Usage = Field(default_factory=Usage)
    attempt_usage: Usage = Field(default_factory=Usage)
    attempt_start_iteration: int = 0
    started_at: float | None = None
    note: str | None = None
    critique: StepCritique | None = None
    """Set while the step's result is with its critic (``critic`` in the step's spec)."""


class AwaitKind(StrEnum):
    """What the task is waiting for."""

    PLAN = "plan"
    PREHYDRATE = "prehydrate"
    REASON = "reason"
    TOOLS = "tools"
    VERIFY = "verify"
    CRITIC = "critic"


_OLD_ESCALATION_KEY = "__escalation__:"


class Awaiting(BaseModel):
    """The dispatch the task waits on: only observations with this fence are applied."""

    kind: AwaitKind
    fence: Fence
    deadline: float
    dispatched_at: float | None = None
    """When this dispatch (or its last re-send) went out: start-to-close counts from it."""
    unstarted_looks: int = 0
    """Deadline looks that found it not started with its queue empty (a second one: lost)."""
    redeliveries: int = 0
    calls: list[ToolCallAction] = Field(default_factory=list)
    dispatched: list[str] = Field(default_factory=list)
    purpose: str = "act"
    results: dict[str, Observation] = Field(default_factory=dict)
    terminal_output: str | None = None
    escalations: dict[str, str] = Field(default_factory=dict)
    """Call id → reason, for the calls whose recovery strategy escalated (``Escalate``)."""
    tool_ms: float = 0.0
    """How long the longest of the calls observed so far ran on its worker."""
    chained: bool = False
    """A reasoning dispatch whose worker sends the approved calls on itself; their results
    may arrive first and wait in ``results``."""
    child_iterations: int = 0
    """Iterations the sub-agents answering this iteration's ``delegate`` calls used: they
    count against the step's iteration limit once every result is in."""
    edited: dict[str, str] = Field(default_factory=dict)
    """Call id -> the reviewer who edited that held call (its request is gated again)."""
    held: dict[str, ReviewItem] = Field(default_factory=dict)
    """Call id -> the open review of a call the gate held for a human (it is in ``calls``,
    not dispatched, until decided; :class:`coordinator.machine.approvals.Approvals`)."""

    @model_validator(mode="before")
    @classmethod
    def _escalations_apart(cls, data: Any) -> Any:
        """A record written before escalations had their field kept them in ``results``."""
        results = data.get("results") if isinstance(data, dict) else None
        if not isinstance(results, dict):
            return data
        old = {k: v for k, v in results.items() if k.startswith(_OLD_ESCALATION_KEY)}
        if not old:
            return data
        kept = {k: v for k, v in results.items() if k not in old}
        escalations = {
            k.removeprefix(_OLD_ESCALATION_KEY): v.get("content", "") if isinstance(v, dict) else ""
            for k, v in old.items()
        }
        return {**data, "results": kept, "escalations": escalations}

    def in_flight(self) -> list[str]:
        """Dispatched calls (sent to a worker, not delegated) still unanswered."""
        delegated = self.delegated()
        return [c for c in self.dispatched if c not in self.results and c not in delegated]

    def missing_calls(self) -> list[ToolCallAction]:
        """The calls whose observation has not arrived yet."""
        return [c for c in self.calls if c.call_id not in self.results]

    @property
    def reasoning(self) -> bool:
        """A model call (reasoning, planning or a critic's), rather than tool calls."""
        return self.kind in (AwaitKind.REASON, AwaitKind.PLAN, AwaitKind.CRITIC)

    @property
    def queue(self) -> str:
        """The Celery queue this dispatch went to."""
        return keys.reasoning_queue if self.reasoning else keys.tools_queue

    def liveness_ids(self) -> list[str]:
        """The ``orga:heartbeats`` members of this dispatch: the model call's, or each
        dispatched tool call's still unanswered."""
        if self.reasoning:
            return [self.fence.liveness_id()]
        return [
            self.fence.for_call(c).liveness_id()
            for c in self.dispatched
            if c not in self.results and c not in self.delegated()
        ]

    def delegated(self) -> set[str]:
        """The call ids of this iteration's ``delegate`` calls (answered by child tasks, not
        by workers: they have no heartbeat and are never re-sent)."""
        return {c.call_id for c in self.calls if is_delegate(c.name)}

    def waits_only_on_children(self) -> bool:
        """Every call still unanswered is a delegation whose child task runs."""
        missing = self.missing_calls()
        return bool(missing) and all(
            is_delegate(c.name) and c.call_id in self.dispatched for c in missing
        )


ReviewDecision = DecisionKind
"""``approve`` and ``revise`` decide a step's result (a review with a critic payload);
``approve``, ``edit``, ``reject`` and ``abort`` decide a held tool call (source ``call``)."""
ReviewSource = Literal[
    "tracker", "detector", "recovery", "critic", "critic_escalation", "call", "budget"
]

RESERVED_REVIEWERS = frozenset({"deadline", "coordinator", "system"})
"""Names the runtime records decisions under (``deadline``: a review's default applied at its
deadline); no human decision is recorded under them."""

_REVIEWER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:-]{0,63}")


class ReviewerError(OrgaError, ValueError):
    """A decision names its reviewer with a reserved or malformed name."""


def check_reviewer(by: str) -> str:
    """``by`` when it can name the human who decided a review; ReviewerError otherwise."""
    if by.lower() in RESERVED_REVIEWERS:
        raise ReviewerError(
            f"reviewer name {by!r} is reserved for decisions the runtime makes; "
            "decide under your own name (USER)"
        )
    if not _REVIEWER.fullmatch(by):
        raise ReviewerError(
            f"reviewer name {by[:64]!r} is not valid: use 1 to 64 letters, digits, '.', '_', ':', "
            "'@' or '-', starting with a letter or digit"
        )
    return by


class ReviewItem(BaseModel):
    """An escalation waiting for a human, with the context a reviewer needs."""

    review_id: str
    task_id: str
    step_id: str
    source: ReviewSource
    reason: str
    created_at: float
    deadline: float
    default_decision: ReviewDecision
    snapshot: dict[str, Any] = Field(default_factory=dict)
    decision: ReviewDecision | None = None
    hint: str | None = None
    decided_by: str | None = None
    call: ToolCallAction | None = None
    """For a review of one held tool call (source ``call``): the call as proposed."""
    input_schema: dict[str, Any] | None = None
    """The held call's tool input schema: what an edit of its arguments must satisfy."""


Awaiting.model_rebuild()  # its ``held`` holds ReviewItems, defined after it


class ChildRef(BaseModel):
    """A sub-agent task this task created with a ``delegate`` call, and what became of it."""

    task_id: str
    agent: str
    call_id: str
    step_id: str
    iteration: int
    goal: str = ""
    status: str = "submitted"
    """``submitted`` until its end comes back: then ``completed``, ``failed``, ``aborted`` or
    ``rejected`` (the intake refused it)."""
    reserved_iterations: int = 0
    reserved_tokens: int = 0
    reserved_cost_usd: float = 0.0
    """The child's budget (``ParentLink.max_iterations`` / ``max_total_tokens``), held out of
    what its parent's step has left while it runs, so that siblings share the step's budget
    instead of each getting all of it (0 in a record written before reservations);
    ``reserved_cost_usd`` holds the money it may spend out of its parent's
    (``ParentLink.max_cost_usd``)."""

    @property
    def finished(self) -> bool:
        """Its end came back."""
        return self.status != "submitted"


class Outage(BaseModel):
    """A service the task needs is down (a worker said so): what, since when, and when the
    held dispatch goes out again."""

    error_kind: Literal["provider_unavailable", "policy_unavailable"]
    service: str
    since: float
    """When the first report of it came (unix seconds)."""
    error: str
    reports: int = 1
    retry_at: float | None = None
    """While the task holds its dispatch: when it is sent again."""

    def reason(self, now: float) -> str:
        """Why the task ended: the outage, named, with how long it lasted."""
        what = "provider" if self.error_kind == "provider_unavailable" else "policy engine"
        since = _clock(self.since)
        return (
            f"{what} {self.service} unavailable since {since} ({now - self.since:.0f} s, "
            f"{self.reports} dispatch(es) failed on it): {self.error}"
        )

    def waiting(self) -> str:
        """What ``orga status`` says while the task holds its dispatch."""
        what = "provider" if self.error_kind == "provider_unavailable" else "policy engine"
        at = _clock(self.retry_at) if self.retry_at is not None else "?"
        return (
            f"waiting on the {what} {self.service} (retry at {at}; down since {_clock(self.since)})"
        )


def _clock(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).isoformat(timespec="seconds")


class TaskRecord(BaseModel):
    """A task's whole state, stored as one JSON document and updated by compare-and-set."""

    model_config = ConfigDict(validate_assignment=False)

    task_id: str
    spec: TaskSpec
    status: TaskStatus = TaskStatus.PENDING
    version: int = 0
    created_at: float
    updated_at: float
    steps: list[StepRecord] = Field(default_factory=list)
    current: int = 0
    conversation: Conversation = Field(default_factory=Conversation, exclude=True)
    """Kept apart from the state, append-only, in ``orga:conversation:{task_id}``
    (:class:`coordinator.store.TaskStore`): a commit writes the new messages, not the whole."""
    iteration_started_at: float | None = None
    """When the current iteration's reasoning was dispatched (the iteration-time metric)."""
    conversation_epoch: int = 0
    """Bumped when a compaction rewrote the stored conversation instead of appending to it."""
    usage: Usage = Field(default_factory=Usage)
    iteration: int = 0
    tracker: dict[str, Any] = Field(default_factory=dict)
    detector: dict[str, Any] = Field(default_factory=dict)
    journal_seq: int = 0
    model_calls: int = 0
    critic_calls: int = 0
    """Critic model calls answered (a scripted critic resumes its own script from here)."""
    dispatches: int = 0
    milestones: list[str] = Field(default_factory=list)
    awaiting: Awaiting | None = None
    review: ReviewItem | None = None
    outage: Outage | None = None
    """A service the task needs is down: its dispatch is held, no attempt used up."""
    output: str = ""
    error: str | None = None
    applied: int = 0
    children: list[ChildRef] = Field(default_factory=list)
    """The sub-agent tasks this task created, in order (``{task_id}.{n}``)."""
    workspace: str | None = None
    """The task's workspace folder, fixed when the task starts (its ``workspace``, else
    ``{ORGA_WORKSPACE_ROOT}/{task_id}`` of the coordinator that started it) and used by every
    later dispatch, whichever coordinator or CLI makes it."""

    def restore_conversation(self, stored: Sequence[str | bytes]) -> bool:
        """Put the conversation read from ``orga:conversation:{task_id}`` in place. False when
        nothing is stored there and the state itself holds the conversation (a record written
        before conversations were stored apart): that one is kept, and the next commit writes
        it whole."""
        if not stored and self.conversation.messages:
            return False
        self.conversation = Conversation(
            messages=[ConversationMessage.model_validate_json(m) for m in stored]
        )
        return True

    @property
    def terminal(self) -> bool:
        """True once the task completed, failed or was aborted."""
        return self.status in TERMINAL_STATUSES

    def next_deadline(self) -> float:
        """When the coordinator must look at this task again without any message arriving."""
        if self.status is TaskStatus.PENDING:
            return self.created_at
        if self.status is TaskStatus.AWAITING_REVIEW and self.review is not None:
            awaiting = self.awaiting
            if awaiting is not None and awaiting.held:  # held calls; the others may run
                first = min(item.deadline for item in awaiting.held.values())
                return min(first, awaiting.deadline) if awaiting.in_flight() else first
            return self.review.deadline
        if self.awaiting is not None:
            return self.awaiting.deadline
        return self.updated_at + 60.0

    def step(self) -> StepRecord:
        """The current step."""
        return self.steps[self.current]

    def result(self) -> dict[str, Any]:
        """What ``orga result`` prints: status, output, per-step results, milestones, usage."""
        return {
            "task_id": self.task_id,
            "status": self.status.value,
            "output": self.output,
            "error": self.error,
            "milestones": list(self.milestones),
            "steps": [
                {
                    "id": s.spec.id,
                    "status": s.status.value,
                    "verified": s.verified,
                    "output": s.output,
                    "iterations": s.iterations,
                    "attempts": s.attempts,
                    "note": s.note,
                }
                for s in self.steps
            ],
            "usage": self.usage.model_dump(),
            "max_cost_usd": self.spec.max_cost_usd,
        }
