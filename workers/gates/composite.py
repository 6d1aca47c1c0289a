"""Several gates as one: every gate must allow; the first denial wins; modifications chain; an
``Ask`` of any gate holds the (modified) call for a reviewer, unless a later gate denies it."""

from __future__ import annotations

from collections.abc import Iterable

from shared.actions import Allow, Ask, Deny, GateDecision, Modify, ProposedAction
from shared.errors import ConfigError
from workers.gates.base import GateContext, ReasoningPolicyGate

__all__ = ["CompositeGate"]


class CompositeGate:
    """Asks the gates in order; each sees the action as modified by the gates before it.

    The result is the first Deny; else an Ask when a gate asked (its reasons joined with
    ``"; "``, carrying the final action when a gate modified it); else a Modify carrying the
    final action and the reasons of every modification joined with ``"; "``; else Allow.
    """

    def __init__(self, gates: Iterable[ReasoningPolicyGate]) -> None:
        self._gates = tuple(gates)
        if not self._gates:
            raise ConfigError("CompositeGate needs at least one gate; pass gates=[...]")

    @property
    def gates(self) -> tuple[ReasoningPolicyGate, ...]:
        """The gates, in the order they are asked."""
        return self._gates

    async def evaluate_action(self, action: ProposedAction, context: GateContext) -> GateDecision:
        """The combined decision."""
        current = action
        reasons: list[str] = []
        asked: list[str] = []
        for gate in self._gates:
            decision = await gate.evaluate_action(current, context)
            if isinstance(decision, Deny):
                return decision
            if isinstance(decision, Modify):
                current = decision.action
                reasons.append(decision.reason)
            elif isinstance(decision, Ask):
                current = decision.action or current
                asked.append(decision.reason)
        if asked:
            return Ask(reason="; ".join(asked), action=current if current is not action else None)
        return Modify(action=current, reason="; ".join(reasons)) if reasons else Allow()
