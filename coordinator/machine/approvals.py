"""Approvals: tool calls the gate held for a human (``Ask``), and the reviewer's decisions.

A held call stays in its iteration's ``Awaiting.calls`` without being dispatched, with an open
review (source ``call``) in ``Awaiting.held``; the turn's other calls run meanwhile. While any
call is held the task shows ``awaiting_review`` (its ``review`` is the oldest held call's).
A decision applies to that one call:

- ``approve``: the call is dispatched as proposed;
- ``edit``: it is dispatched with the reviewer's arguments, checked against the tool's input
  schema first (a bad edit is refused naming the field; nothing changes); the tool worker puts
  the edited call to the gate again: its deny rules apply, its ``Ask`` stands approved;
- ``reject``: the reviewer's message becomes the call's result, which the model reads;
- ``abort``: the task ends, aborted.

At its deadline an undecided call takes the task's ``review.default_decision``: ``abort``
aborts the task; ``retry`` and ``skip`` reject the call with a message saying no reviewer
decided in time (a call is never run without a human's approval).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from coordinator.machine.core import Section
from coordinator.state import Awaiting, ReviewDecision, ReviewItem, TaskStatus
from shared.actions import Observation, ToolCallAction
from shared.approval import CALL_DECISIONS, HeldCall, check_arguments, edited_call, rejection_text
from shared.events import CallDecided, CallHeld, Escalated

__all__ = ["Approvals"]

_TIMED_OUT = (
    "no reviewer decided on this call before its deadline, so it was not run; do not retry it "
    "as proposed"
)


class Approvals(Section):
    """Held tool calls: their reviews opened, decided, and expired."""

    def hold(self, awaiting: Awaiting, held: Sequence[HeldCall]) -> None:
        """Open a review for each held call; the calls wait in ``awaiting`` undispatched."""
        m, record = self.m, self.record
        spec = record.spec.review
        for one in held:
            item = ReviewItem(
                review_id=uuid.uuid4().hex[:12],
                task_id=record.task_id,
                step_id=record.step().spec.id,
                source="call",
                reason=one.reason,
                created_at=m.now,
                deadline=m.now + spec.deadline.total_seconds(),
                default_decision=spec.default_decision,
                snapshot={**m.reviews.snapshot("call"), "call": _shown(one.call)},
                call=one.call,
                input_schema=one.input_schema,
            )
            awaiting.calls.append(one.call)
            awaiting.held[one.call.call_id] = item
            m.effects.reviews.append(item)
            m.journal(
                CallHeld.of(
                    review_id=item.review_id,
                    call_id=one.call.call_id,
                    tool=one.call.name,
                    arguments=one.call.arguments,
                    reason=one.reason,
                    deadline=datetime.fromtimestamp(item.deadline, UTC),
                    redactor=m.settings.journal_redactor,
                )
            )
            m.journal(
                Escalated(
                    review_id=item.review_id,
                    source="call",
                    reason=one.reason,
                    deadline=datetime.fromtimestamp(item.deadline, UTC),
                    default_decision=item.default_decision,
                )
            )
            m.event("escalated", review_id=item.review_id, reason=one.reason[:500], source="call")
        awaiting.calls = self.in_model_order(awaiting.calls)
        self.show(awaiting)

    def in_model_order(self, calls: list[ToolCallAction]) -> list[ToolCallAction]:
        """The calls in the order the model proposed them (their results are observed so)."""
        proposed = next(
            (m for m in reversed(self.record.conversation.messages) if m.tool_calls), None
        )
        if proposed is None:
            return calls
        order = {call.id: index for index, call in enumerate(proposed.tool_calls)}
        return sorted(calls, key=lambda c: order.get(c.call_id, len(order)))

    def show(self, awaiting: Awaiting) -> None:
        """The task's status and ``review`` say whether a call waits for a human."""
        record = self.record
        if awaiting.held:
            record.status = TaskStatus.AWAITING_REVIEW
            record.review = min(awaiting.held.values(), key=lambda item: item.created_at)
        else:
            record.status = TaskStatus.RUNNING
            record.review = None

    def held(self, review_id: str) -> ReviewItem | None:
        """The open review of a held call of the awaited iteration, if ``review_id`` is one."""
        awaiting = self.record.awaiting
        if awaiting is None:
            return None
        held = awaiting.held.values()
        return next((item for item in held if item.review_id == review_id), None)

    def check(
        self, item: ReviewItem, decision: ReviewDecision, arguments: str | None
    ) -> str | None:
        """ValueError (ArgumentsError for a bad edit), before anything changes, for a decision
        a held call does not take; the edited arguments as JSON text for an edit."""
        if decision not in CALL_DECISIONS:
            raise ValueError(
                f"review {item.review_id} holds one tool call, so {decision!r} does not apply; "
                "decide it with approve, edit (with the new arguments), reject (with a "
                "message for the model) or abort"
            )
        if decision != "edit":
            if arguments:
                raise ValueError(f"only an edit takes arguments, not {decision!r}")
            return None
        assert item.call is not None
        try:
            parsed = json.loads(arguments or "")
        except ValueError as exc:
            raise ValueError(
                f"edited arguments for {item.call.name!r} are not JSON ({exc}); send an object"
            ) from exc
        checked = check_arguments(item.call.name, parsed, item.input_schema)
        return edited_call(item.call, checked).arguments

    def decide(
        self,
        item: ReviewItem,
        decision: ReviewDecision,
        message: str | None,
        arguments: str | None,
        decided_by: str,
    ) -> None:
        """Apply a checked decision to its held call, then go on with the iteration."""
        m, record = self.m, self.record
        awaiting = record.awaiting
        assert awaiting is not None
        assert item.call is not None
        call = item.call
        del awaiting.held[call.call_id]
        item.decision, item.hint, item.decided_by = decision, message, decided_by
        m.event("review_decided", review_id=item.review_id, decision=decision, by=decided_by)
        m.journal(
            CallDecided.of(
                review_id=item.review_id,
                call_id=call.call_id,
                tool=call.name,
                decision=decision,
                decided_by=decided_by,
                arguments_before=call.arguments,
                arguments_after=arguments if decision == "edit" else None,
                message=message,
                redactor=m.settings.journal_redactor,
            )
        )
        if decision == "abort":
            m.steps.finish(TaskStatus.ABORTED, f"aborted by review {item.review_id}: {item.reason}")
            return
        if decision == "edit" and arguments is not None:
            edited = call.model_copy(update={"arguments": arguments})
            awaiting.calls = [edited if c.call_id == call.call_id else c for c in awaiting.calls]
            awaiting.edited[call.call_id] = decided_by
        elif decision == "reject":
            text = rejection_text(message, decided_by)
            awaiting.results[call.call_id] = (
                Observation.tool_error(call.name, text)
                .with_call_id(call.call_id)
                .with_metadata(error_type="rejected", tool_name=call.name)
            )
        self.show(awaiting)
        m.acting.advance(awaiting)

    def expire(self, awaiting: Awaiting) -> bool:
        """Apply the default to held calls past their deadline; True when one was."""
        due = [item for item in awaiting.held.values() if item.deadline <= self.m.now]
        for item in sorted(due, key=lambda i: i.deadline):
            if self.record.terminal:
                break
            if item.default_decision == "abort":
                self.decide(item, "abort", None, None, "deadline")
            else:
                self.decide(item, "reject", _TIMED_OUT, None, "deadline")
        return bool(due)


def _shown(call: ToolCallAction) -> dict[str, object]:
    """The held call as a reviewer reads it: its tool, id and arguments (parsed when JSON)."""
    try:
        arguments: object = call.parsed_arguments()
    except ValueError:
        arguments = call.arguments
    return {"tool": call.name, "call_id": call.call_id, "arguments": arguments}
