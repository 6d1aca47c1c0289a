"""Budget: the money a task may spend on model calls (``limits.max_cost_usd``).

Every model call's request carries what the task has left (:meth:`Budget.left`: its limit,
less what it spent, its critics' and finished sub-agents' calls included, less what its
running sub-agents reserved); the reasoning worker does not send a call whose worst case
would pass it (:mod:`workers.phases`) and answers ``budget_exhausted`` instead. The step then
ends with that reason, the milestones kept (:meth:`Budget.exhausted`): the task fails, or, with
``on_budget_exhausted: escalate``, waits for a human.

A sub-agent reserves its money out of what its parent has left (its ``budget.cost_usd``, else
an even share among the turn's delegations not yet created), as it reserves iterations and
tokens (:mod:`coordinator.machine.delegation`); its actual spending replaces the reservation
when it ends.
"""

from __future__ import annotations

from coordinator.machine.core import Section
from coordinator.state import StepStatus, TaskStatus
from shared.loop_types import LoopConfig, TerminationKind, TerminationReason
from shared.protocol import ReasonedMessage

__all__ = ["Budget"]


class Budget(Section):
    """The task's money: what is left, what a request may spend, what happens when it ends."""

    def left(self) -> float | None:
        """USD the task may still spend (None: it has no money limit)."""
        record = self.record
        limit = record.spec.max_cost_usd
        if limit is None:
            return None
        held = sum(c.reserved_cost_usd for c in record.children if not c.finished)
        return max(limit - record.usage.cost_usd - held, 0.0)

    def config(self, config: LoopConfig) -> LoopConfig:
        """A request's config with the money left now (unchanged without a money limit)."""
        left = self.left()
        if left is None:
            return config
        return config.model_copy(update={"max_cost_usd": left})

    def share(self, asked: float | None, waiting: int) -> float | None:
        """What a new child reserves: what it asked for, capped by what is left, else an
        even share among the ``waiting`` delegations of the turn (None: no money limit)."""
        left = self.left()
        if left is None:
            return None
        return min(asked, left) if asked is not None else left / max(waiting, 1)

    @staticmethod
    def is_exhausted(message: ReasonedMessage) -> bool:
        """Whether the worker did not send the call for want of money."""
        termination = message.termination
        return termination is not None and termination.kind is TerminationKind.BUDGET_EXHAUSTED

    def exhausted(self, message: ReasonedMessage) -> None:
        """The money ran out: the step ends with ``budget exhausted`` (milestones kept), and
        the task fails or escalates (``limits.on_budget_exhausted``)."""
        m, record = self.m, self.record
        termination = message.termination
        reason = termination.message if termination and termination.message else "budget exhausted"
        m.event("budget_exhausted", reason=reason[:500])
        if record.spec.limits.on_budget_exhausted == "escalate" and record.steps:
            m.reviews.escalate("budget", reason)
            return
        if record.steps and record.step().status is StepStatus.RUNNING:
            step = record.step()
            step.status = StepStatus.FAILED
            step.note = reason
            kind = TerminationKind.BUDGET_EXHAUSTED
            m.steps.end_loop(TerminationReason(kind=kind, message=reason))
        m.steps.finish(TaskStatus.FAILED, reason)
