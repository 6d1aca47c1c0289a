"""Observe: every result of an iteration is in; verify, consult the stagnation detector, go on."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from coordinator.machine.core import Section
from coordinator.state import Awaiting, AwaitKind, TaskStatus
from shared.actions import Observation, ToolCallAction
from shared.conversation import ConversationMessage
from shared.events import (
    ObservationsCollected,
    StagnationDetected,
    ToolResultRecord,
    ToolsDispatched,
    VerificationRun,
)
from shared.stagnation import StagnationLevel, StagnationVerdict, ToolEvent

__all__ = ["Observing"]


class Observing(Section):
    """What the task does once the calls it waited on have all answered."""

    def all_observed(self, awaiting: Awaiting) -> None:
        if awaiting.kind is AwaitKind.VERIFY:
            self.verified(awaiting)
        elif awaiting.kind is AwaitKind.PREHYDRATE:
            self.m.prehydration.done(awaiting)
        else:
            self.observe(awaiting)

    def observe(self, awaiting: Awaiting) -> None:
        m, record = self.m, self.record
        observations = [awaiting.results[c.call_id] for c in awaiting.calls]
        for observation in observations:
            record.conversation.push(observation.as_tool_message())
        duration = timedelta(milliseconds=awaiting.tool_ms)
        count = len(observations)
        m.journal(ToolsDispatched(iteration=record.iteration, tool_count=count, duration=duration))
        redactor = m.settings.journal_redactor
        results = [ToolResultRecord.of(o, redactor) for o in observations]
        m.journal(
            ObservationsCollected(
                iteration=record.iteration, observation_count=count, results=results
            )
        )
        record.awaiting = None
        if awaiting.child_iterations:  # sub-agents' iterations count against the step's
            record.iteration += awaiting.child_iterations
            record.step().iterations += awaiting.child_iterations
        if awaiting.escalations:
            m.reviews.escalate("recovery", next(iter(awaiting.escalations.values())))
            return
        verdict = self.consult_detector(awaiting.calls, observations)
        if verdict is not None and self.apply_verdict(verdict):
            return
        m.reasoning.next_iteration()

    def consult_detector(
        self, calls: Sequence[ToolCallAction], observations: Sequence[Observation]
    ) -> StagnationVerdict | None:
        events = [
            ToolEvent.from_observation(call, observation, strict=False)
            for call, observation in zip(calls, observations, strict=True)
        ]
        return self.m.detector.observe_batch(events) if events else None

    def apply_verdict(self, verdict: StagnationVerdict) -> bool:
        """Apply a stagnation verdict; True when it ended or suspended the step."""
        m = self.m
        if verdict.level is StagnationLevel.NONE:
            return False
        if verdict.escalated:
            m.journal(StagnationDetected.from_verdict(verdict))
            m.event("stagnation", level=verdict.level.value, kind=str(verdict.kind or ""))
        if verdict.level in (StagnationLevel.NUDGE, StagnationLevel.REPLAN):
            if verdict.escalated:
                self.record.conversation.push(ConversationMessage.user(verdict.message))
                # the model's next turn answers this message, not its own last report
                m.detector.report_answered()
            return False
        if verdict.level is StagnationLevel.ASK_HUMAN:
            m.reviews.escalate("detector", verdict.message)
        else:
            m.steps.finish(
                TaskStatus.ABORTED, f"stagnation detector aborted the task: {verdict.message}"
            )
        return True

    def verified(self, awaiting: Awaiting) -> None:
        """The ``done_when`` check ran: complete the step (after its critic's verdict, when it
        has one), or fail the attempt with its output."""
        m, record = self.m, self.record
        check = record.step().spec.done_when
        assert check is not None
        observation = awaiting.results[awaiting.calls[0].call_id]
        record.awaiting = None
        exit_code = observation.metadata.get("exit_code")
        passed = _exit_code(exit_code) == check.expect_exit_code
        m.journal(
            VerificationRun(
                step_id=record.step().spec.id,
                command=check.command,
                exit_code=_exit_code(exit_code),
                expected=check.expect_exit_code,
                passed=passed,
            )
        )
        if passed:
            m.critics.review(
                awaiting.terminal_output or "", verified=True, check_output=observation.content
            )
            return
        tail = observation.content[-1500:]
        feedback = (
            f"[Verification failed] `{check.command}` exited with {exit_code} "
            f"(expected {check.expect_exit_code}):\n{tail}"
        )
        record.conversation.push(ConversationMessage.user(feedback))
        m.limits.attempt_failed(feedback)


def _exit_code(value: str | None) -> int | None:
    """The integer exit code a tool reported, or None when absent or malformed."""
    try:
        return int(value.strip()) if value is not None else None
    except ValueError:
        return None
