"""Critics: a step's result reviewed by its critic (an agent's model, or a human) before it
completes; a revision's reason goes back to the worker, too many revisions escalate."""

from __future__ import annotations

from coordinator.machine.core import Section
from coordinator.state import AwaitKind, StepCritique, StepStatus
from shared.conversation import Conversation, ConversationMessage
from shared.critic import CriticPayload, CriticReplyError, critic_conversation, parse_verdict
from shared.events import CriticReplyRejected, CriticRequested, CriticVerdict
from shared.inference import Usage
from shared.protocol import Fence, ReasonedMessage, ReasonRequest
from shared.task_spec import CriticSpec, ProviderSpec

__all__ = ["MAX_CRITIC_REPLIES_REJECTED", "Critics"]

MAX_CRITIC_REPLIES_REJECTED = 2
"""Malformed critic replies in a row before the step escalates (the first is asked again)."""


class Critics(Section):
    """The step's critic between the worker's answer and the step's completion."""

    @property
    def spec(self) -> CriticSpec:
        critic = self.record.step().spec.critic
        assert critic is not None  # only called for a step that has one
        return critic

    @property
    def critique(self) -> StepCritique:
        critique = self.record.step().critique
        assert critique is not None  # set by review() before anything else runs
        return critique

    def review(self, result: str, verified: bool, check_output: str | None) -> None:
        """The worker says the step is done (and its ``done_when`` passed): complete it, or,
        when the step has a critic, ask the critic first."""
        step = self.record.step()
        if step.spec.critic is None:
            self.m.steps.complete(result, verified)
            return
        if step.critique is None:
            step.critique = StepCritique(result=result, verified=verified)
        critique = step.critique
        critique.result, critique.verified, critique.check_output = result, verified, check_output
        critique.rejected = 0
        critique.last_error = None
        self.ask()

    def ask(self) -> None:
        """Put the result before the critic: a model call, or a review for a human critic."""
        m, record, critic = self.m, self.record, self.spec
        record.awaiting = None
        step_id = record.step().spec.id
        round_ = self.critique.rounds + 1
        if critic.human:
            item = m.reviews.escalate(
                "critic",
                f"the result of step {step_id!r} waits for a human critic's verdict "
                f"(review round {round_}; approve it, or ask for a revision with a reason)",
            )
            m.journal(
                CriticRequested(
                    step_id=step_id, critic=critic.reviewer, round=round_, review_id=item.review_id
                )
            )
            return
        m.journal(CriticRequested(step_id=step_id, critic=critic.reviewer, round=round_))
        m.event("critic_requested", step_id=step_id, critic=critic.reviewer, round=str(round_))
        self.dispatch()

    def dispatch(self) -> None:
        """Send the critic's model call to a reasoning worker."""
        m = self.m
        fence = m.fence()
        m.await_(AwaitKind.CRITIC, fence)
        m.effects.reason_dispatches.append(self.request_for(fence))

    def request_for(self, fence: Fence) -> ReasonRequest:
        """The critic's model call under ``fence``: the critic's provider and conversation,
        its own count of calls (a scripted critic resumes its own script), and room for this
        one call whatever iterations the worker used (the step's tokens still bound it)."""
        request = self.m.reasoning.request(fence, self.conversation(), purpose="critic")
        config = request.config.model_copy(update={"max_iterations": fence.iteration + 1})
        return request.model_copy(
            update={
                "provider": self.spec.provider or ProviderSpec(),
                "model_calls": self.record.critic_calls,
                "config": config,
            }
        )

    def conversation(self) -> Conversation:
        """The critic call's conversation: the question, and why its last reply was refused."""
        conversation = critic_conversation(self.spec, self.payload())
        error = self.critique.last_error
        if error is not None:
            conversation.push(
                ConversationMessage.user(f"[Coordinator] Your last reply was rejected: {error}")
            )
        return conversation

    def payload(self) -> CriticPayload:
        """What the critic reviews (the model's prompt, the human review's context)."""
        step = self.record.step()
        critique, critic = self.critique, self.spec
        check = step.spec.done_when
        return CriticPayload(
            critic=critic.reviewer,
            rubric=critic.rubric,
            step_id=step.spec.id,
            instruction=step.spec.instruction,
            result=critique.result,
            done_when=check.command if check is not None else None,
            done_when_output=critique.check_output,
            round=critique.rounds + 1,
            max_rounds=critic.max_rounds,
            verdicts=list(critique.verdicts),
        )

    def apply(self, message: ReasonedMessage) -> None:
        """The critic's model answered: a verdict, or a reply that is not one."""
        record, step = self.record, self.record.step()
        record.critic_calls += 1
        record.usage = record.usage + message.usage
        step.usage = step.usage + message.usage
        step.attempt_usage = step.attempt_usage + message.usage
        if self.m.budget.is_exhausted(message):
            self.m.budget.exhausted(message)
            return
        try:
            if message.termination is not None:
                raise CriticReplyError(
                    f"the critic's model call ended without a verdict: {message.termination}"
                )
            reply = parse_verdict(message.terminal_output)
        except CriticReplyError as exc:
            self.rejected(str(exc), message.usage)
            return
        self.verdict(reply.verdict, reply.reason, self.spec.reviewer, message.usage)

    def rejected(self, error: str, usage: Usage) -> None:
        """A reply that is not a verdict: journaled; the critic is asked once more, then the
        step escalates to a human."""
        m, step, critique = self.m, self.record.step(), self.critique
        critique.rejected += 1
        retried = critique.rejected < MAX_CRITIC_REPLIES_REJECTED
        m.journal(
            CriticReplyRejected(
                step_id=step.spec.id,
                critic=self.spec.reviewer,
                round=critique.rounds + 1,
                error=error[:2000],
                retried=retried,
                usage=usage,
            )
        )
        m.event("critic_reply_rejected", step_id=step.spec.id, error=error[:300])
        if retried:
            critique.last_error = error[:1000]
            self.dispatch()
            return
        critique.rejected = 0
        critique.last_error = None
        m.reviews.escalate(
            "critic_escalation",
            f"the critic {self.spec.reviewer} of step {step.spec.id!r} gave no valid verdict "
            f"in {MAX_CRITIC_REPLIES_REJECTED} replies; last: {error[:500]}",
        )

    def verdict(self, verdict: str, reason: str, decided_by: str, usage: Usage) -> None:
        """Approve completes the step; revise sends the reason back to the worker, or, past
        ``max_rounds`` revisions, escalates the step with both sides' words."""
        m, step, critique, critic = self.m, self.record.step(), self.critique, self.spec
        round_ = critique.rounds + 1
        critique.verdicts.append({"verdict": verdict, "reason": reason, "decided_by": decided_by})
        m.journal(
            CriticVerdict(
                step_id=step.spec.id,
                critic=critic.reviewer,
                round=round_,
                verdict="approve" if verdict == "approve" else "revise",
                reason=reason,
                decided_by=decided_by,
                usage=usage,
            )
        )
        m.event("critic_verdict", step_id=step.spec.id, verdict=verdict, reason=reason[:300])
        if verdict == "approve":
            m.steps.complete(critique.result, critique.verified)
        elif critique.rounds >= critic.max_rounds:
            m.reviews.escalate(
                "critic_escalation",
                f"the critic {critic.reviewer} asked for revision {critique.rounds + 1} of step "
                f"{step.spec.id!r}, beyond its max_rounds ({critic.max_rounds}): {reason[:1000]}",
            )
        else:
            self.revise(reason, decided_by)

    def revise(self, reason: str, decided_by: str) -> None:
        """The reason goes to the worker as a user message; the step's loop goes on (the round
        gets the step's timeout afresh; the iterations stay the step's)."""
        m, step, critique = self.m, self.record.step(), self.critique
        critique.rounds += 1
        step.status = StepStatus.RUNNING
        step.started_at = m.now
        self.record.conversation.push(
            ConversationMessage.user(
                f"[Critic {decided_by}] Revise the result of step '{step.spec.id}' "
                f"(revision {critique.rounds} of at most {self.spec.max_rounds}): {reason}"
            )
        )
        m.reasoning.next_iteration()
