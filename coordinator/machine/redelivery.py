"""Redelivery: a dispatch that failed or went quiet is re-sent, or dead-lettered."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from coordinator.liveness import Liveness, Verdict
from coordinator.machine.core import Section
from coordinator.machine.outages import OUTAGE_KINDS
from coordinator.state import Awaiting, AwaitKind, TaskStatus
from shared import ids
from shared.events import DispatchFailed
from shared.protocol import ReasonedMessage, WorkerFailedMessage

__all__ = ["Redelivery"]


class Redelivery(Section):
    """Worker failures and deadlines of the dispatch the task waits on."""

    def worker_failed(self, awaiting: Awaiting, message: WorkerFailedMessage) -> None:
        m = self.m
        if message.error_kind in OUTAGE_KINDS:
            m.outages.reported(awaiting, message)
            return
        config = message.error_kind == "config"
        retried = (
            not config and message.retryable and awaiting.redeliveries < m.settings.max_redeliveries
        )
        m.journal(
            DispatchFailed(
                fence=message.fence.token(),
                error=message.error[:2000],
                retried=retried,
                error_kind=message.error_kind,
            )
        )
        if config:
            self.config_failure(awaiting, message.error)
        elif retried:
            self.redispatch(awaiting)
        else:
            self.dead_letter(awaiting, message.error)

    def late(self, awaiting: Awaiting, liveness: Liveness | None) -> None:
        """A dispatch past its deadline: still alive, re-sent, or (too often) dead-lettered.
        Waiting only on sub-agents is not late: their ends come back by themselves."""
        if awaiting.waits_only_on_children():
            self.m.delegation.look_later(awaiting)
            return
        if self.m.outages.holding():
            self.m.outages.retry(awaiting)
            return
        if liveness is not None and self.still_alive(awaiting, liveness):
            return
        settings = self.m.settings
        if awaiting.redeliveries >= settings.max_redeliveries:
            self.dead_letter(
                awaiting,
                f"no observation after {awaiting.redeliveries + 1} dispatches of "
                f"{awaiting.fence.token()} (deadline {settings.observation_deadline_s}s each)",
            )
        else:
            self.redispatch(awaiting)

    def still_alive(self, awaiting: Awaiting, liveness: Liveness) -> bool:
        """Move a late dispatch's deadline on when it runs, is answered or is queued; False
        when it is lost (journaled as an event either way it changes)."""
        m = self.m
        judgement = liveness.judge(
            m.liveness_ids(),
            m.now,
            awaiting.dispatched_at,
            awaiting.unstarted_looks,
            m.settings.liveness,
        )
        if judgement.look_again_at is None:
            m.event("dispatch_lost", fence=awaiting.fence.token(), reason=judgement.reason)
            return False
        if judgement.verdict is Verdict.UNSTARTED:
            awaiting.unstarted_looks += 1
        awaiting.deadline = judgement.look_again_at
        if judgement.verdict is Verdict.NO_CONSUMER:
            m.event("no_consumer", fence=awaiting.fence.token(), reason=judgement.reason)
        return True

    def redispatch(self, awaiting: Awaiting) -> None:
        m, record = self.m, self.record
        record.dispatches += 1
        fence = awaiting.fence.model_copy(
            update={"attempt": record.dispatches, "nonce": ids.uuid4().hex[:12]}
        )
        awaiting.fence = fence
        awaiting.redeliveries += 1
        awaiting.deadline = m.now + m.deadline_s()
        awaiting.dispatched_at = m.now
        awaiting.unstarted_looks = 0
        m.event("redispatched", fence=fence.token(), kind=awaiting.kind.value)
        if awaiting.kind is AwaitKind.CRITIC:
            m.effects.reason_dispatches.append(m.critics.request_for(fence))
            return
        if awaiting.kind in (AwaitKind.REASON, AwaitKind.PLAN):
            awaiting.results.clear()  # results of the abandoned dispatch's chained calls
            conversation = (
                m.planning.conversation()
                if awaiting.kind is AwaitKind.PLAN
                else record.conversation
            )
            purpose: Literal["act", "plan"] = "plan" if awaiting.kind is AwaitKind.PLAN else "act"
            m.effects.reason_dispatches.append(m.reasoning.request(fence, conversation, purpose))
            return
        delegated = awaiting.delegated()  # children are never created twice
        awaiting.dispatched = [
            c for c in awaiting.dispatched if c in awaiting.results or c in delegated
        ]
        m.acting.dispatch_more(awaiting)

    def config_failure(self, awaiting: Awaiting, error: str) -> None:
        """A worker said the task or the deployment is misconfigured: no attempt can succeed,
        so the task fails at once with the worker's own message (no retry, no review)."""
        self.m.event("config_error", fence=awaiting.fence.token(), error=error[:500])
        self.m.steps.finish(TaskStatus.FAILED, f"configuration error: {error}")

    def dead_letter(self, awaiting: Awaiting, error: str) -> None:
        m, record = self.m, self.record
        m.effects.dead_letters.append(
            {
                "task_id": record.task_id,
                "fence": awaiting.fence.token(),
                "kind": awaiting.kind.value,
                "error": error[:2000],
                "at": datetime.fromtimestamp(m.now, UTC).isoformat(),
            }
        )
        if awaiting.kind is AwaitKind.PLAN:
            record.awaiting = None
            m.planning.apply(ReasonedMessage(fence=awaiting.fence, terminal_output=""))
            return
        if awaiting.kind is AwaitKind.CRITIC:
            record.awaiting = None
            m.reviews.escalate(
                "critic_escalation",
                f"the critic's model call {awaiting.fence.token()} was dead-lettered: {error}",
            )
            return
        m.delegation.abandon(awaiting)
        m.limits.attempt_failed(f"dispatch {awaiting.fence.token()} dead-lettered: {error}")
