"""What every section of the machine shares: the settings, the effects, and the record's helpers.

:class:`MachineCore` holds the one input being applied (the record, ``now``, the settings) and
the :class:`Effects` it produces, restores the progress tracker and the stagnation detector on
first use, and gives every section the same fence, deadline, journal and event helpers.
"""

from __future__ import annotations

import operator
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from coordinator.liveness import LivenessSettings
from coordinator.state import Awaiting, AwaitKind, ReviewItem, TaskRecord, TaskStatus
from shared import ids
from shared.events import JournalEntry, LoopEvent
from shared.loop_types import LoopConfig
from shared.progress_tracker import ProgressTracker
from shared.protocol import ChildFinishedMessage, Fence, ReasonRequest, ToolRequest
from shared.redaction import Redactor
from shared.stagnation import StagnationDetector
from shared.task_spec import task_workspace

if TYPE_CHECKING:
    from coordinator.machine.task import TaskMachine

__all__ = ["ChildSubmission", "Effects", "MachineCore", "MachineSettings", "Section"]


@dataclass(frozen=True, slots=True)
class MachineSettings:
    """Deadlines and limits the coordinator applies to every task."""

    observation_deadline_s: float = 30.0
    """When a dispatch is first looked at; then as :mod:`coordinator.liveness` says."""
    max_redeliveries: int = 3
    outage_deadline_s: float = 1800.0
    """How long a task holds its dispatch through an outage of its provider or policy engine
    (from the first dispatch that met it) before it fails naming the outage."""
    outage_backoff_s: float = 15.0
    """The first wait before a dispatch held for an outage is sent again (then doubling)."""
    liveness: LivenessSettings = field(default_factory=LivenessSettings)
    workspace_root: str = field(default_factory=lambda: str(Path.home() / ".orga" / "workspaces"))
    recent_messages_in_snapshot: int = 8
    allow_inline_tools: bool = True
    conversation_by_reference: bool = False
    """Reasoning requests carry a reference to the stored conversation, not its messages
    (the coordinator service, whose store keeps it in Redis); False: the messages travel in
    the request (the in-process driver)."""
    inline_read_tools: bool = True
    """Tasks with ``tool_dispatch: auto`` let reasoning workers run read-only calls
    themselves (``ActMode.AUTO``); False: ``ActMode.CHAIN`` for them too."""
    chain_tools: bool = True
    """Let reasoning workers send an iteration's approved calls straight to the tool workers
    (``ActMode.CHAIN``); False: the coordinator dispatches every tool call."""
    max_delegation_depth: int = 3
    """How deep sub-agents may nest: a task's children are at depth 1, theirs at 2..."""
    max_children_per_task: int = 10
    """How many sub-agent tasks one task may create in its whole life."""
    journal_redactor: Redactor = field(default_factory=lambda: Redactor(()))
    """Redacts the process's secrets from the tool results, reference failures and gate
    changes the journal records (workers already redact theirs from what they answer)."""


@dataclass(frozen=True, slots=True)
class ChildSubmission:
    """A sub-agent task to submit through the intake, as ``orga submit`` would: its id and
    its task as JSON (the agent's profile is merged and the whole validated at intake)."""

    task_id: str
    task: str


@dataclass
class Effects:
    """What must happen, atomically with saving the record."""

    reason_dispatches: list[ReasonRequest] = field(default_factory=list)
    tool_dispatches: list[ToolRequest] = field(default_factory=list)
    journal: list[JournalEntry] = field(default_factory=list)
    events: list[dict[str, str]] = field(default_factory=list)
    reviews: list[ReviewItem] = field(default_factory=list)
    dead_letters: list[dict[str, str]] = field(default_factory=list)
    children: list[ChildSubmission] = field(default_factory=list)
    """Sub-agent tasks to submit to the intake (``delegate`` calls)."""
    child_results: list[ChildFinishedMessage] = field(default_factory=list)
    """This task is a sub-agent's and ended: its result, for the parent's observations."""
    cancels: list[dict[str, str]] = field(default_factory=list)
    """Control entries cancelling this task's running children (it ended first)."""
    changed: bool = True

    def stamped(self, epoch: int) -> None:
        """Reasoning requests by reference read the stored conversation of ``epoch``. A request
        is built with the record's epoch (:meth:`Reasoning.request`), so it is copied only when
        the commit moved the epoch since (a compaction, or a store that had not seen the
        conversation): two model copies per dispatch less in the common case."""
        self.reason_dispatches = [
            r.model_copy(update={"conversation_ref": r.conversation_ref.model_copy(
                update={"epoch": epoch})})
            if r.conversation_ref is not None and r.conversation_ref.epoch != epoch else r
            for r in self.reason_dispatches
        ]  # fmt: skip


_V = TypeVar("_V")


class _ByIdentity(Generic[_V]):
    """Values derived from a task's record, kept per task while the objects they were derived
    from are the very ones the record still holds (compared by identity, so a record loaded
    again, or changed, never matches; the kept objects cannot be collected and their ids
    reused). At most ``size`` tasks, least recently kept dropped first."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._kept: OrderedDict[str, tuple[tuple[object, ...], _V]] = OrderedDict()

    def get(self, task_id: str, *sources: object) -> _V | None:
        """The value kept for ``sources``, else None."""
        kept = self._kept.get(task_id)
        if kept is None or len(kept[0]) != len(sources):
            return None
        if not all(map(operator.is_, kept[0], sources)):  # C-speed: no generator per lookup
            return None
        return kept[1]

    def keep(self, task_id: str, value: _V, *sources: object) -> None:
        self._kept.pop(task_id, None)
        self._kept[task_id] = (sources, value)
        while len(self._kept) > self._size:
            self._kept.popitem(last=False)


class _Snapshot(dict[str, Any]):
    """A detector's snapshot as the record stores it (a plain dict to pydantic and to ``==``),
    carrying the live detector it was taken from: the record's next input gets that detector
    instead of restoring the snapshot again (:meth:`StagnationDetector.from_state` restores it
    exactly). It goes with the record; a record loaded again holds a plain dict. The input
    takes it, so that one that fails or is ignored after changing it never leaves it behind."""

    __slots__ = ("live",)

    def __init__(self, state: dict[str, Any], live: StagnationDetector) -> None:
        super().__init__(state)
        self.live: StagnationDetector | None = live

    def take(self) -> StagnationDetector | None:
        live, self.live = self.live, None
        return live


_LOOP_CONFIGS: _ByIdentity[LoopConfig] = _ByIdentity(1024)
"""``TaskSpec.loop_config`` per task (the spec is frozen; a step changes only its iterations)."""


class MachineCore:
    """One input applied to one task record: its state, its effects and the shared helpers."""

    def __init__(self, record: TaskRecord, now: float, settings: MachineSettings) -> None:
        self.record = record
        self.now = now
        self.settings = settings
        self.effects = Effects()
        self.trace_parent: str | None = None
        """The ``traceparent`` of the span deciding this input, set by
        :func:`coordinator.machine.task.decide` before the input is applied: every dispatch is
        built carrying it (no copy of each request afterwards)."""
        self._tracker: ProgressTracker | None = None
        self._detector: StagnationDetector | None = None

    @property
    def tracker(self) -> ProgressTracker:
        """The step's progress tracker, restored from the record on first use."""
        if self._tracker is None:
            spec = self.record.spec
            self._tracker = ProgressTracker.from_state(spec.step_iteration, self.record.tracker)
        return self._tracker

    @property
    def detector(self) -> StagnationDetector:
        """The task's stagnation detector, restored from the record on first use (an input
        that does not observe anything, such as a reasoning answer, neither restores nor
        saves its state, which is the largest part of the record)."""
        if self._detector is None:
            record, spec = self.record, self.record.spec
            state = record.detector
            live = state.take() if isinstance(state, _Snapshot) else None
            if live is None:
                live = StagnationDetector.from_state(spec.stagnation, state)
            self._detector = live
        return self._detector

    def config(self) -> LoopConfig:
        record = self.record
        step = record.step().spec if record.steps else None
        iterations: Any = step.max_iterations if step is not None else None
        config = _LOOP_CONFIGS.get(record.task_id, record.spec, iterations)
        if config is None:
            config = record.spec.loop_config(step)
            _LOOP_CONFIGS.keep(record.task_id, config, record.spec, iterations)
        return config

    def attempt_config(self) -> LoopConfig:
        """The step's config with the iteration limit of the current attempt, in the step's
        running iteration numbers (a worker compares it with the fence's iteration)."""
        config = self.config()
        if not self.record.steps:
            return config
        start = self.record.step().attempt_start_iteration
        return config.model_copy(update={"max_iterations": config.max_iterations + start})

    def workspace(self) -> str:
        """The task's workspace, fixed the first time it is asked for (at the start) and kept
        in the record: a later decision taken under another ``ORGA_WORKSPACE_ROOT`` (or none)
        resumes in the same folder."""
        record = self.record
        if record.workspace is None:
            root = self.settings.workspace_root
            link = record.spec.delegation
            if record.spec.workspace is not None:
                record.workspace = record.spec.workspace
            elif (
                link is not None
                and link.workspace
                and record.spec.delegated_workspace == "subfolder"
            ):
                record.workspace = f"{link.workspace}/subagents/{record.task_id}"
            else:
                record.workspace = task_workspace(root, record.task_id)
        return record.workspace

    def workspace_base(self) -> str | None:
        """For a sub-agent: where a worker starts checking its workspace from, folder by folder
        (:mod:`workers.workspaces`): the delegation tree root's workspace for a subfolder of
        its parent's, the workspace root for a copy (None: not a sub-agent, or one working in a
        folder its task names)."""
        link = self.record.spec.delegation
        if link is None or not link.workspace or self.record.spec.workspace is not None:
            return None
        workspace = self.workspace()
        if workspace.startswith(f"{link.workspace}/subagents/"):
            return link.workspace_base or link.workspace
        return os.path.dirname(workspace)  # a copy, at {root}/{child id}: checked from the root

    def workspace_template(self) -> str | None:
        """The folder copied into the workspace when it is created: the task's template, or,
        for a sub-agent working on a copy, its parent's workspace."""
        spec = self.record.spec
        link = spec.delegation
        copied = spec.delegated_workspace == "copy" and spec.workspace is None
        if spec.workspace_template is None and link is not None and copied:
            return link.copy_from
        return spec.workspace_template

    def fence(self) -> Fence:
        """A fence no earlier dispatch of this task had: ``attempt`` counts every dispatch."""
        record = self.record
        record.dispatches += 1
        return Fence(
            task_id=record.task_id,
            step_id=record.step().spec.id,
            iteration=record.iteration,
            attempt=record.dispatches,
            nonce=ids.uuid4().hex[:12],
        )

    def deadline_s(self) -> float:
        return self.settings.observation_deadline_s

    def await_(self, kind: AwaitKind, fence: Fence) -> Awaiting:
        """The task now waits on the dispatch under ``fence``."""
        self.close_held()
        awaiting = Awaiting(
            kind=kind, fence=fence, deadline=self.now + self.deadline_s(), dispatched_at=self.now
        )
        self.record.awaiting = awaiting
        return awaiting

    def close_held(self) -> None:
        """The awaited iteration is given up (a new dispatch, an escalation, the task's end):
        the reviews of its held calls are closed undecided, and the task no longer shows one."""
        record = self.record
        if record.review is not None and record.review.source == "call":
            record.review = None
            if record.status is TaskStatus.AWAITING_REVIEW:
                record.status = TaskStatus.RUNNING
        awaiting = record.awaiting
        if awaiting is None or not awaiting.held:
            return
        for item in awaiting.held.values():
            self.event("review_closed", review_id=item.review_id)
        awaiting.held.clear()

    def journal(self, event: LoopEvent) -> None:
        record = self.record
        step_id = record.step().spec.id if record.steps else None
        self.effects.journal.append(
            JournalEntry(
                sequence=record.journal_seq,
                timestamp=datetime.fromtimestamp(self.now, UTC),
                agent_id=record.spec.agent_id,
                iteration=record.iteration,
                event=event,
                task_id=record.task_id,
                step_id=step_id,
            )
        )
        record.journal_seq += 1

    def event(self, event_name: str, **fields: str) -> None:
        self.effects.events.append(
            {"task_id": self.record.task_id, "event": event_name, "at": f"{self.now:.3f}", **fields}
        )

    def ignored(self) -> Effects:
        self.effects.changed = False
        return self.effects

    def done(self) -> Effects:
        record = self.record
        if self._tracker is not None:
            record.tracker = self._tracker.to_state()
        if self._detector is not None:
            record.detector = _Snapshot(self._detector.to_state(), self._detector)
        record.updated_at = self.now
        record.applied += 1
        return self.effects


class Section:
    """One section of the machine's decisions, applied to the machine's record and effects;
    sections call each other through the machine (``self.m.steps``, ``self.m.tools``...)."""

    def __init__(self, machine: TaskMachine) -> None:
        self.m = machine

    @property
    def record(self) -> TaskRecord:
        return self.m.record
