"""A gate that allows every action: for development and trusted sandboxes only."""

from __future__ import annotations

import logging

from shared.actions import Allow, GateDecision, ProposedAction
from workers.gates.base import GateContext

__all__ = ["PermissiveGate"]

log = logging.getLogger(__name__)


class PermissiveGate:
    """Allows everything (Symbiont's ``permissive_for_dev_only``).

    Unlike Symbiont it does not log a warning per action: it warns once, when it is built, so
    that a long run's log is not flooded.
    """

    def __init__(self) -> None:
        log.warning("gate.permissive_enabled")

    async def evaluate_action(self, action: ProposedAction, context: GateContext) -> GateDecision:
        """Always Allow."""
        return Allow()
