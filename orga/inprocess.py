"""The in-process driver: one task run to its end in this process, on the same loop core.

The loop has one implementation. :class:`~coordinator.machine.TaskMachine` decides (steps,
limits, the progress tracker, the stagnation detector, milestones, pre-hydration, reviews,
journaling) and :func:`workers.handlers.run_dispatch` executes (Reason, Gate, Act, knowledge).
The product steps them with the coordinator service and Celery workers over Redis; this
driver steps them with no Redis and no Celery, the way arq's burst mode or dramatiq's
``StubBroker`` run a queue in a test::

    driver = InProcessDriver(local_core())
    run = await driver.run({"goal": "...", "steps": [...], "provider": {...}})
    run.record.status, run.journal

Each dispatch runs as an asyncio task, so the calls of one iteration run concurrently, as they
do across tool workers; their answers are applied one at a time, in arrival order, as the
coordinator applies them from its stream. An escalation asks the :class:`Reviewer`, if there
is one; without one (or when it leaves the review open) the run returns waiting for review.

With ``stream_tokens`` a reasoning's model call streams its answer (OpenAI ``stream: true``,
Anthropic's event stream), and the run keeps the entries a deployment's worker writes to the
task's tokens stream (:class:`~workers.token_stream.ListTokenSink`: the same fields and the
same ``stream_restarted`` rule) in :attr:`InProcessRun.tokens`, readable while it runs through
:meth:`InProcessDriver.live`.

A ``delegate`` call's child task runs as a run of its own, concurrently, resolved against
``agents`` as the intake would; its end comes back to the parent's answers
(:class:`ChildFinishedMessage`), and a parent that ends cancels its children still running.
A child left waiting for a review nobody here decides makes its parent's run return too.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from coordinator.machine import Effects, MachineSettings, TaskMachine, decide
from coordinator.machine.core import ChildSubmission
from coordinator.machine.delegation import rejected_child
from coordinator.state import ReviewDecision, ReviewItem, TaskRecord, TaskStatus
from shared.agent_profile import AgentProfile, resolve_agent
from shared.delegation import parent_link
from shared.errors import OrgaError
from shared.events import JournalEntry
from shared.journal import JournalWriter
from shared.protocol import ChildFinishedMessage, ReasonRequest, ToolRequest
from shared.task_spec import TaskSpec, TaskSpecError, decode_task_text
from shared.tokens import TokenEntry
from workers.handlers import Answer, WorkerServices, run_dispatch
from workers.providers.streaming import streaming_to
from workers.token_stream import ListTokenSink

__all__ = ["InProcessDriver", "InProcessRun", "LoopStalledError", "ReviewVerdict", "Reviewer"]

MAX_INPUTS = 100_000
"""Inputs one run may apply before the driver gives up on it (a runaway guard)."""


class LoopStalledError(OrgaError):
    """The task waits on nothing that can answer: a bug in the loop, never a user mistake."""


@dataclass(frozen=True, slots=True)
class ReviewVerdict:
    """A reviewer's decision on an escalation."""

    decision: ReviewDecision
    hint: str | None = None
    decided_by: str = "reviewer"
    arguments: dict[str, Any] | None = None
    """An ``edit``'s new arguments for a held tool call (``hint``: a ``reject``'s message)."""


class Reviewer(Protocol):
    """Decides escalations for the in-process driver (a person at a prompt, or a test)."""

    async def decide(self, review: ReviewItem) -> ReviewVerdict | None:
        """The decision, or None to leave the review open (the run then returns)."""
        ...


@dataclass
class InProcessRun:
    """What one run produced: the final record and everything the service would have
    written beside it."""

    record: TaskRecord
    journal: list[JournalEntry] = field(default_factory=list)
    events: list[dict[str, str]] = field(default_factory=list)
    reviews: list[ReviewItem] = field(default_factory=list)
    dead_letters: list[dict[str, str]] = field(default_factory=list)
    children: dict[str, InProcessRun] = field(default_factory=dict)
    """The runs of the sub-agent tasks this task created, by task id."""
    tokens: list[TokenEntry] = field(default_factory=list)
    """The task's tokens stream (``stream_tokens``): the streamed answers' entries, in order."""

    @property
    def status(self) -> TaskStatus:
        """The task's status when the run returned."""
        return self.record.status

    def result(self) -> dict[str, Any]:
        """What ``orga result`` prints for this task."""
        return self.record.result()


@dataclass
class InProcessDriver:
    """Runs tasks through :class:`TaskMachine` and :func:`run_dispatch` in this process."""

    services: WorkerServices
    settings: MachineSettings = field(default_factory=MachineSettings)
    reviewer: Reviewer | None = None
    journal_writer: JournalWriter | None = None
    clock: Callable[[], float] = time.time
    agents: Mapping[str, AgentProfile] = field(default_factory=dict)
    """The agents a task may name (``agent: NAME``), as the registry in Redis holds them."""
    stream_tokens: bool = False
    """Stream the model's answers into :attr:`InProcessRun.tokens` (``ORGA_STREAM_TOKENS``)."""
    _running: dict[str, _Run] = field(default_factory=dict, init=False, repr=False)

    def cancel(self, task_id: str, reason: str = "cancelled by operator") -> bool:
        """Abort a task running in this driver (``orga cancel``): its children are cancelled
        with it and every milestone is kept. False when no such task runs here."""
        running = self._running.get(task_id)
        if running is None:
            return False
        running.inbox.put_nowait(_Cancel(reason))
        return True

    def live(self, task_id: str) -> InProcessRun | None:
        """What a task running in this driver (a sub-agent's too) has done so far."""
        running = self._running.get(task_id)
        return running.out if running is not None else None

    async def run(
        self, task: TaskSpec | dict[str, Any] | str, task_id: str | None = None
    ) -> InProcessRun:
        """Run ``task`` until it ends, or waits for a review nobody here decides."""
        return await _Run(self, InProcessRun(self.record(task, task_id))).execute()

    def record(
        self,
        task: TaskSpec | dict[str, Any] | str,
        task_id: str | None,
        source: str = "in-process task",
    ) -> TaskRecord:
        """A new task's record, its agent merged as the intake merges it (TaskSpecError)."""
        if isinstance(task, str):
            data = decode_task_text(task, source=source)
            spec = resolve_agent(data, self.agents, source=source)
        elif isinstance(task, TaskSpec) and task.agent is None:
            spec = task
        else:
            data = (
                task.model_dump(mode="json", exclude_unset=True)
                if isinstance(task, TaskSpec)
                else task
            )
            spec = resolve_agent(data, self.agents, source="task")
        now = self.clock()
        return TaskRecord(
            task_id=task_id or uuid.uuid4().hex, spec=spec, created_at=now, updated_at=now
        )


@dataclass(frozen=True, slots=True)
class _Cancel:
    """A parent that ended asks its child to stop (the control stream's ``cancel``)."""

    reason: str


@dataclass(frozen=True, slots=True)
class _Blocked:
    """A child run returned waiting for a review nobody here decides."""


@dataclass
class _Run:
    """One run's moving parts: the dispatches in flight, the children and the answers."""

    driver: InProcessDriver
    out: InProcessRun
    parent: _Run | None = None
    inbox: asyncio.Queue[Answer | ChildFinishedMessage | _Cancel | _Blocked] = field(
        default_factory=asyncio.Queue
    )
    in_flight: set[asyncio.Task[None]] = field(default_factory=set)
    children: dict[str, _Run] = field(default_factory=dict)
    child_tasks: set[asyncio.Task[InProcessRun]] = field(default_factory=set)
    blocked: bool = False
    child_error: BaseException | None = None

    async def execute(self) -> InProcessRun:
        self.driver._running[self.out.record.task_id] = self
        try:
            await self._apply(lambda machine: machine.start())
            for _ in range(MAX_INPUTS):
                record = self.out.record
                if self.child_error is not None:
                    raise self.child_error
                if record.terminal or self.blocked:
                    return self.out
                if record.status is TaskStatus.AWAITING_REVIEW:
                    if not await self._review():
                        return self.out
                    continue
                if await self._held_for_outage():
                    continue
                answer = await self._next_answer()
                if answer is None:  # nothing answered within start-to-close: as a lost dispatch
                    await self._apply(partial(TaskMachine.on_tick, liveness=None))
                elif isinstance(answer, _Cancel):
                    await self._apply(partial(TaskMachine.cancel, reason=answer.reason))
                elif isinstance(answer, _Blocked):
                    self.blocked = True
                else:
                    await self._apply(partial(TaskMachine.on_answer, message=answer))
            raise LoopStalledError(
                f"task {self.out.record.task_id}: more than {MAX_INPUTS} inputs; giving up"
            )
        finally:
            self.driver._running.pop(self.out.record.task_id, None)
            for running in (*self.in_flight, *self.child_tasks):
                running.cancel()
            await asyncio.gather(*self.in_flight, *self.child_tasks, return_exceptions=True)

    async def _held_for_outage(self) -> bool:
        """The task holds its dispatch through an outage of its provider or policy engine and
        nothing else runs: wait until the hold ends, then send it again (the deadline tick)."""
        outage = self.out.record.outage
        if outage is None or outage.retry_at is None or not self.inbox.empty():
            return False
        await asyncio.sleep(max(outage.retry_at - self.driver.clock(), 0.0))
        await self._apply(partial(TaskMachine.on_tick, liveness=None))
        return True

    async def _next_answer(self) -> Answer | ChildFinishedMessage | _Cancel | _Blocked | None:
        """The next answer; None when none came within start-to-close (the dispatches in
        flight are then cancelled, as a coordinator gives up on a call past that bound;
        children keep running)."""
        if self.inbox.empty() and not self.in_flight and not self.child_tasks:
            awaiting = self.out.record.awaiting
            raise LoopStalledError(
                f"task {self.out.record.task_id} waits on "
                f"{awaiting.fence.token() if awaiting else 'nothing'} and nothing runs"
            )
        bound = self.driver.settings.liveness.start_to_close_s
        try:
            return await asyncio.wait_for(self.inbox.get(), timeout=bound)
        except TimeoutError:
            for running in self.in_flight:
                running.cancel()
            await asyncio.gather(*self.in_flight, return_exceptions=True)
            return None

    async def _review(self) -> bool:
        """Ask the reviewer about the open review; False when nobody decides it here."""
        review = self.out.record.review
        reviewer = self.driver.reviewer
        verdict = await reviewer.decide(review) if reviewer and review else None
        if verdict is None or review is None:
            return False
        edited = None if verdict.arguments is None else json.dumps(verdict.arguments)
        await self._apply(
            lambda machine: machine.on_review_decision(
                review.review_id, verdict.decision, verdict.hint, verdict.decided_by, edited
            )
        )
        return True

    async def _apply(self, step: Callable[[TaskMachine], Effects]) -> None:
        machine = TaskMachine(self.out.record, self.driver.clock(), self.driver.settings)
        effects = decide(machine, step)
        if not effects.changed:
            return
        machine.record.version += 1
        self.out.record = machine.record
        await self._record(effects)
        for reason in effects.reason_dispatches:
            self._start(reason)
        for tool in effects.tool_dispatches:
            self._start(tool)
        for child in effects.children:
            self._start_child(child)
        for result in effects.child_results:
            if self.parent is not None:
                self.parent.inbox.put_nowait(result)
        for cancel in effects.cancels:
            running = self.children.get(cancel["task_id"])
            if running is not None:
                running.inbox.put_nowait(_Cancel(cancel["reason"]))

    def _start_child(self, child: ChildSubmission) -> None:
        """A sub-agent's task, resolved as the intake would, run beside this one."""
        try:
            source = f"sub-agent task {child.task_id}"  # as the intake names it
            record = self.driver.record(child.task, child.task_id, source)
        except TaskSpecError as exc:
            link = parent_link(child.task)
            if link is not None:
                self.inbox.put_nowait(rejected_child(child.task_id, link, str(exc)))
            return
        run = _Run(self.driver, InProcessRun(record), parent=self)
        self.children[child.task_id] = run
        self.out.children[child.task_id] = run.out
        running = asyncio.get_running_loop().create_task(run.execute())
        self.child_tasks.add(running)
        running.add_done_callback(self._child_done)

    def _child_done(self, running: asyncio.Task[InProcessRun]) -> None:
        self.child_tasks.discard(running)
        if running.cancelled():
            return
        error = running.exception()
        if error is not None:
            self.child_error = error
            self.inbox.put_nowait(_Blocked())
        elif not running.result().record.terminal:
            self.inbox.put_nowait(_Blocked())

    async def _record(self, effects: Effects) -> None:
        self.out.journal.extend(effects.journal)
        self.out.events.extend(effects.events)
        self.out.reviews.extend(effects.reviews)
        self.out.dead_letters.extend(effects.dead_letters)
        writer = self.driver.journal_writer
        if writer is not None:
            for entry in effects.journal:
                await writer.append(entry)

    def _start(self, request: ReasonRequest | ToolRequest) -> None:
        # Through JSON, as on the wire: the worker's copy shares nothing with the record.
        request = type(request).model_validate_json(request.model_dump_json())
        running = asyncio.get_running_loop().create_task(self._dispatch(request))
        self.in_flight.add(running)
        running.add_done_callback(self.in_flight.discard)

    async def _dispatch(self, request: ReasonRequest | ToolRequest) -> None:
        """Run one dispatch as a worker would; what it chains runs as dispatches of its own."""
        with self._streaming(request):
            outcome = await run_dispatch(request, self.driver.services)
        for chained in outcome.chained:
            self._start(chained)
        for answer in outcome.answers:
            self.inbox.put_nowait(answer)

    def _streaming(self, request: ReasonRequest | ToolRequest) -> AbstractContextManager[None]:
        """A reasoning's model call streams its answer into the run's tokens, as a worker's
        does into the task's tokens stream, when the driver streams tokens."""
        if not isinstance(request, ReasonRequest) or not self.driver.stream_tokens:
            return nullcontext()
        return streaming_to(ListTokenSink(self.out.tokens, request.fence, request.purpose))
