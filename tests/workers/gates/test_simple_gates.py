"""Permissive, tool-filter and composite gates; Symbiont's policy_bridge tests (§13.9) ported."""

from __future__ import annotations

import logging

import pytest

from shared.actions import Allow, Deny, GateDecision, Modify, ProposedAction, ToolCallAction
from shared.errors import ConfigError
from tests.workers.gates.actions import (
    ALL_KINDS,
    context,
    decide,
    delegate,
    respond,
    terminate,
    tool,
)
from workers.gates.base import GateContext, ReasoningPolicyGate
from workers.gates.composite import CompositeGate
from workers.gates.default import DefaultPolicyGate
from workers.gates.permissive import PermissiveGate
from workers.gates.tool_filter import ToolFilterGate


@pytest.mark.parametrize("action", ALL_KINDS, ids=lambda a: a.kind)
def test_permissive_allows_all_actions(action: ProposedAction) -> None:
    """test_permissive_dev_only_allows_all_actions: every kind of action is allowed."""
    assert isinstance(decide(PermissiveGate(), action), Allow)


def test_permissive_warns_once_not_per_action(caplog: pytest.LogCaptureFixture) -> None:
    """The permissive gate warns when built and stays quiet for each action."""
    with caplog.at_level(logging.DEBUG, logger="workers.gates.permissive"):
        gate = PermissiveGate()
        for action in ALL_KINDS:
            decide(gate, action)
    assert [r.message for r in caplog.records] == ["gate.permissive_enabled"]


def test_tool_filter_allows_whitelisted_tools() -> None:
    """test_tool_filter_allows_whitelisted_tools: a listed tool is allowed."""
    gate = ToolFilterGate.allow(["search", "calculator"])
    assert isinstance(decide(gate, tool("search")), Allow)


def test_tool_filter_denies_non_whitelisted_tools() -> None:
    """test_tool_filter_denies_non_whitelisted_tools: Symbiont's exact reason."""
    decision = decide(ToolFilterGate.allow(["search"]), tool("delete_everything"))
    assert decision == Deny(reason="Tool 'delete_everything' not in allowed list")


def test_tool_filter_is_case_sensitive() -> None:
    """Names match exactly: 'Search' is not 'search'."""
    assert isinstance(decide(ToolFilterGate.allow(["search"]), tool("Search")), Deny)


@pytest.mark.parametrize("action", [respond(), delegate(), terminate()], ids=lambda a: a.kind)
def test_tool_filter_allows_non_tool_actions(action: ProposedAction) -> None:
    """test_tool_filter_allows_non_tool_actions: respond, delegate and terminate pass."""
    assert isinstance(decide(ToolFilterGate.allow(["search"]), action), Allow)


def test_tool_filter_allow_all() -> None:
    """test_tool_filter_allow_all: any tool is allowed."""
    gate = ToolFilterGate.allow_all()
    assert gate.allowed is None
    assert isinstance(decide(gate, tool("anything")), Allow)


def test_tool_filter_empty_list_allows_no_tool() -> None:
    """An empty allow-list denies every tool but still lets the agent answer."""
    gate = ToolFilterGate.allow([])
    assert isinstance(decide(gate, tool("search")), Deny)
    assert isinstance(decide(gate, respond()), Allow)


# -- composite -------------------------------------------------------------------------------


class _Rename:
    """A gate that renames one tool to another (a Modify)."""

    def __init__(self, old: str, new: str) -> None:
        self.old = old
        self.new = new
        self.seen: list[ProposedAction] = []

    async def evaluate_action(self, action: ProposedAction, context: GateContext) -> GateDecision:
        self.seen.append(action)
        if isinstance(action, ToolCallAction) and action.name == self.old:
            renamed = action.model_copy(update={"name": self.new})
            return Modify(action=renamed, reason=f"{self.old} -> {self.new}")
        return Allow()


def test_composite_all_allow() -> None:
    """Every gate allows: the composite allows."""
    gate = CompositeGate([PermissiveGate(), ToolFilterGate.allow(["search"])])
    assert isinstance(decide(gate, tool("search")), Allow)


def test_composite_first_deny_wins_and_stops() -> None:
    """The first denial is returned and later gates are not asked."""
    later = _Rename("x", "y")
    gate = CompositeGate([ToolFilterGate.allow(["a"]), ToolFilterGate.allow([]), later])
    assert decide(gate, tool("b")) == Deny(reason="Tool 'b' not in allowed list")
    assert later.seen == []


def test_composite_chains_modifications() -> None:
    """Each gate sees the action the previous one produced; reasons are joined."""
    second = _Rename("grep", "search")
    gate = CompositeGate([_Rename("find", "grep"), second])
    decision = decide(gate, tool("find"))
    assert isinstance(decision, Modify)
    assert isinstance(decision.action, ToolCallAction)
    assert decision.action.name == "search"
    assert decision.reason == "find -> grep; grep -> search"
    assert [a.name for a in second.seen if isinstance(a, ToolCallAction)] == ["grep"]


def test_composite_deny_after_modify() -> None:
    """A later gate can deny the modified action."""
    gate = CompositeGate([_Rename("find", "rm"), ToolFilterGate.allow(["find"])])
    assert decide(gate, tool("find")) == Deny(reason="Tool 'rm' not in allowed list")


def test_composite_needs_a_gate() -> None:
    """An empty composite is a configuration error."""
    with pytest.raises(ConfigError, match="at least one gate"):
        CompositeGate([])


@pytest.mark.parametrize(
    "gate",
    [
        PermissiveGate(),
        ToolFilterGate.allow_all(),
        DefaultPolicyGate(),
        CompositeGate([PermissiveGate()]),
    ],
    ids=["permissive", "tool_filter", "default", "composite"],
)
def test_gates_satisfy_the_protocol(gate: ReasoningPolicyGate) -> None:
    """Every gate is a ReasoningPolicyGate and always lets the agent respond and terminate."""
    assert isinstance(gate, ReasoningPolicyGate)
    assert isinstance(decide(gate, respond(), context()), Allow)
    assert isinstance(decide(gate, terminate(), context()), Allow)
