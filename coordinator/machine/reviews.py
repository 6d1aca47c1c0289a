"""Reviews: escalate to a human with the context they need, and apply their decision."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from coordinator.machine.core import Section
from coordinator.state import ReviewDecision, ReviewItem, ReviewSource, TaskStatus
from shared.conversation import ConversationMessage
from shared.events import Escalated, ReviewDecided
from shared.inference import Usage

__all__ = ["RESULT_SOURCES", "Reviews"]

RESULT_SOURCES: frozenset[ReviewSource] = frozenset({"critic", "critic_escalation"})
"""The reviews of a step's result (its critic's): they take ``approve`` and ``revise`` too."""


class Reviews(Section):
    """The human-review queue's side of the machine."""

    def escalate(self, source: ReviewSource, reason: str) -> ReviewItem:
        m, record = self.m, self.record
        m.close_held()
        review_spec = record.spec.review
        item = ReviewItem(
            review_id=uuid.uuid4().hex[:12],
            task_id=record.task_id,
            step_id=record.step().spec.id,
            source=source,
            reason=reason,
            created_at=m.now,
            deadline=m.now + review_spec.deadline.total_seconds(),
            default_decision=review_spec.default_decision,
            snapshot=self.snapshot(source),
        )
        record.status = TaskStatus.AWAITING_REVIEW
        record.awaiting = None
        record.review = item
        m.effects.reviews.append(item)
        m.journal(
            Escalated(
                review_id=item.review_id,
                source=source,
                reason=reason,
                deadline=datetime.fromtimestamp(item.deadline, UTC),
                default_decision=item.default_decision,
            )
        )
        m.event("escalated", review_id=item.review_id, reason=reason[:500], source=source)
        return item

    def snapshot(self, source: ReviewSource) -> dict[str, Any]:
        """What a reviewer sees: the goal, the step, recent turns, milestones and counters, and
        for a step whose result is with its critic, the critic's payload (``critic``: the
        rubric, the worker's result, the ``done_when`` output and the verdicts so far), for a
        review of that result (:data:`RESULT_SOURCES`)."""
        record = self.record
        step = record.step()
        recent = record.conversation.messages[-self.m.settings.recent_messages_in_snapshot :]
        link = record.spec.delegation
        parent = None
        if link is not None:
            parent = {
                "task_id": link.task_id,
                "goal": link.goal,
                "step": {"id": link.step_id, "instruction": link.step_instruction},
                "depth": link.depth,
            }
        critic = (
            {"critic": self.m.critics.payload().model_dump(mode="json")}
            if source in RESULT_SOURCES and step.critique is not None
            else {}
        )
        return {
            **critic,
            "goal": record.spec.goal,
            "parent": parent,
            "step": {"id": step.spec.id, "instruction": step.spec.instruction},
            "iteration": record.iteration,
            "attempts": step.attempts,
            "milestones": list(record.milestones),
            "counters": self.m.detector.counters(),
            "recent": [
                {
                    "role": msg.role.value,
                    "content": msg.content[:500],
                    "tool": msg.tool_name or "",
                    "tool_calls": [f"{c.name}({c.arguments[:200]})" for c in msg.tool_calls],
                }
                for msg in recent
            ],
        }

    def check(self, decision: ReviewDecision, hint: str | None) -> None:
        """ValueError, before anything changes, for a decision the open review does not take:
        ``approve`` and ``revise`` decide a step's result (its critic's review, or its
        escalation), and ``revise`` needs its reason."""
        review = self.record.review
        assert review is not None
        if decision in ("edit", "reject"):
            raise ValueError(
                f"review {review.review_id} ({review.source}) is not about a held tool call, so "
                f"{decision!r} does not apply; decide it with retry, skip or abort"
            )
        if decision not in ("approve", "revise"):
            return
        if review.source not in RESULT_SOURCES or self.record.step().critique is None:
            raise ValueError(
                f"review {review.review_id} ({review.source}) is not about a step's result, so "
                f"{decision!r} does not apply; decide it with retry, skip or abort"
            )
        if decision == "revise" and not (hint or "").strip():
            raise ValueError(
                f"a revision of review {review.review_id} needs its reason: what the worker "
                "must change (the hint)"
            )

    def decide(self, decision: ReviewDecision, hint: str | None, decided_by: str) -> None:
        m, record = self.m, self.record
        review = record.review
        assert review is not None
        review.decision = decision
        review.hint = hint
        review.decided_by = decided_by
        m.event("review_decided", review_id=review.review_id, decision=decision, by=decided_by)
        m.journal(
            ReviewDecided(
                review_id=review.review_id, decision=decision, decided_by=decided_by, hint=hint
            )
        )
        record.review = None
        if decision == "abort":
            m.steps.finish(
                TaskStatus.ABORTED, f"aborted by review {review.review_id}: {review.reason}"
            )
            return
        record.status = TaskStatus.RUNNING
        if decision == "skip":
            m.steps.skip(f"skipped by review {review.review_id}: {review.reason}")
            return
        step = record.step()
        if decision in ("approve", "revise"):
            self.decide_result(review, decision, hint, decided_by)
            return
        step.critique = None  # a new attempt: its result goes to the critic afresh
        m.tracker.begin_step(step.spec.id)
        m.detector.reset_window()
        m.limits.new_attempt(step)
        if hint:
            record.conversation.push(ConversationMessage.user(f"[Human reviewer] {hint}"))
        m.reasoning.dispatch()

    def decide_result(
        self, review: ReviewItem, decision: ReviewDecision, hint: str | None, decided_by: str
    ) -> None:
        """A human's verdict on a step's result, as a critic's: a human critic's revisions
        count against ``max_rounds``; a revision decided on an escalation gives the worker
        ``max_rounds`` revisions again."""
        critique = self.record.step().critique
        assert critique is not None  # check() refused the decision otherwise
        if review.source == "critic_escalation":
            critique.rounds = 0
        verdict = "approve" if decision == "approve" else "revise"
        reason = hint or f"approved by {decided_by}"
        self.m.critics.verdict(verdict, reason, f"human:{decided_by}", Usage())
