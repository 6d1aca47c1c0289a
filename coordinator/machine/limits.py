"""Limits: a failed attempt counts against the step; past its limit, skip, abort or escalate."""

from __future__ import annotations

from coordinator.machine.core import Section
from coordinator.state import StepRecord, TaskStatus
from shared.conversation import ConversationMessage
from shared.events import AttemptFailed, StepLimitReached
from shared.inference import Usage
from shared.progress_tracker import LimitAction

__all__ = ["Limits"]


class Limits(Section):
    """The progress tracker's per-step attempt limit and stuck detection, applied."""

    def attempt_failed(self, error: str) -> None:
        m, record = self.m, self.record
        step = record.step()
        step.attempts += 1
        record.awaiting = None
        m.journal(AttemptFailed(step_id=step.spec.id, attempt=step.attempts, error=error[:2000]))
        decision = m.tracker.record_and_check(step.spec.id, error)
        if not decision.stop:
            self.new_attempt(step)
            record.conversation.push(
                ConversationMessage.user(
                    f"[Coordinator] Attempt {step.attempts} of step '{step.spec.id}' failed: "
                    f"{error[:1500]}\nTry a different approach."
                )
            )
            m.reasoning.dispatch()
            return
        attempts = m.tracker.attempt_count(step.spec.id)
        m.journal(StepLimitReached.from_decision(step.spec.id, attempts, decision))
        # The tracker says why it stopped; the last error says what failed (the review's
        # context, the skip note, the abort error all show it).
        reason = f"{decision.reason}; last error: {error[:500]}" if decision.reason else error
        action = m.tracker.limit_action
        m.event("budget_exhausted", step_id=step.spec.id, action=action.value, reason=reason[:500])
        if action is LimitAction.SKIP_STEP:
            m.steps.skip(reason)
        elif action is LimitAction.ABORT_TASK:
            m.steps.finish(TaskStatus.ABORTED, reason)
        else:
            m.reviews.escalate("tracker", reason)

    def new_attempt(self, step: StepRecord) -> None:
        """A fresh iteration and token budget; iteration numbers keep growing within the step,
        so a fence is never reused and a late observation of an old attempt stays stale."""
        step.attempt_start_iteration = self.record.iteration
        step.started_at = self.m.now
        step.attempt_usage = Usage()
