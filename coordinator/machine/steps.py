"""Steps: start one, complete, skip or move on, and finish the task keeping its milestones."""

from __future__ import annotations

from datetime import timedelta

from coordinator.machine.core import Section
from coordinator.state import StepStatus, TaskStatus
from shared.conversation import ConversationMessage
from shared.events import Started, Terminated
from shared.loop_types import TerminationKind, TerminationReason

__all__ = ["Steps"]


class Steps(Section):
    """The task's steps in order, each run as its own loop."""

    def start(self, index: int) -> None:
        m, record = self.m, self.record
        record.current = index
        record.iteration = 0
        step = record.step()
        step.status = StepStatus.RUNNING
        step.started_at = m.now
        m.tracker.begin_step(step.spec.id)
        if index > 0:
            record.conversation.unpin(self.message(index - 1))
            # the step's first turn answers its instruction, not a report made in the last
            # step (the first step has none: its start does not restore the detector)
            m.detector.report_answered()
        record.conversation.push(ConversationMessage.user(self.message(index), pin=True))
        m.journal(Started(agent_id=record.spec.agent_id, config=m.config()))
        m.event("step_started", step_id=step.spec.id)
        if index == 0 and record.spec.pre_hydration is not None and m.prehydration.start():
            return
        m.reasoning.dispatch()

    def message(self, index: int) -> str:
        """The pinned user message that tells the model which step it is on."""
        step = self.record.steps[index].spec
        text = f"Step {index + 1} of {len(self.record.steps)} ({step.id}): {step.instruction}"
        if step.done_when is not None:
            text += (
                f"\nThis step is verified by running `{step.done_when.command}`, which must "
                f"exit with code {step.done_when.expect_exit_code}."
            )
        return text

    def complete(self, output: str, verified: bool) -> None:
        record = self.record
        step = record.step()
        step.status = StepStatus.COMPLETED
        step.output = output
        step.verified = verified
        if verified:
            name = f"step:{step.spec.id}"
            record.milestones.append(name)
            self.m.detector.milestone(name)
        self.end_loop(TerminationReason.completed())
        self.m.event("step_completed", step_id=step.spec.id, verified=str(verified).lower())
        self.next()

    def skip(self, note: str) -> None:
        step = self.record.step()
        step.status = StepStatus.SKIPPED
        step.note = note
        self.end_loop(TerminationReason(kind=TerminationKind.ERROR, message=note))
        self.m.event("step_skipped", step_id=step.spec.id, reason=note[:300])
        self.next()

    def next(self) -> None:
        record = self.record
        if record.current + 1 < len(record.steps):
            self.start(record.current + 1)
            return
        done = [s for s in record.steps if s.status is StepStatus.COMPLETED]
        record.output = done[-1].output if done else ""
        if done:
            self.finish(TaskStatus.COMPLETED, None)
        else:
            self.finish(
                TaskStatus.FAILED, f"no step completed: all {len(record.steps)} were skipped"
            )

    def end_loop(self, reason: TerminationReason) -> None:
        step = self.record.step()
        now = self.m.now
        self.m.journal(
            Terminated(
                reason=reason,
                iterations=step.iterations,
                total_usage=step.usage,
                duration=timedelta(seconds=max(now - (step.started_at or now), 0)),
            )
        )

    def finish(self, status: TaskStatus, error: str | None) -> None:
        """End the task with ``status``; its milestones stay in the record."""
        record = self.record
        if record.status in (TaskStatus.RUNNING, TaskStatus.AWAITING_REVIEW) and record.steps:
            step = record.step()
            if step.status is StepStatus.RUNNING:
                step.status = StepStatus.FAILED
                step.note = error
                kind = TerminationKind.ERROR
                self.end_loop(TerminationReason(kind=kind, message=error))
        self.m.close_held()
        record.status = status
        record.error = error
        record.awaiting = None
        self.m.delegation.ended(status, error)
        if record.review is not None and record.review.decision is None:
            self.m.event("review_closed", review_id=record.review.review_id)
            record.review = None
        self.m.event(
            status.value, error=(error or "")[:500], milestones=",".join(record.milestones)
        )
