"""Approval of one call at the gate: ``require_approval`` rules of the default gate, Cedar's
``@ask`` permits, OPA's ``ask``, the composite's mapping, and the Gate phase holding the call."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from shared.actions import Allow, Ask, Deny, Modify, ToolCallAction
from shared.conversation import Conversation
from shared.inference import ToolDefinition, Usage
from shared.loop_types import LoopConfig, LoopState
from shared.policy import PolicySpec
from tests.fakes.opa_server import FakeOpaServer
from tests.workers.gates.actions import context, decide, respond, tool
from workers.gates.approval import canonical_arguments
from workers.gates.cedar import CedarGate
from workers.gates.composite import CompositeGate
from workers.gates.default import DefaultPolicyGate
from workers.gates.factory import build_gate
from workers.gates.opa import OpaGate
from workers.gates.permissive import PermissiveGate
from workers.phases import PolicyCheck

RULES = ["run_command:git push*", "mcp:*", "file_write:secrets/*"]


@pytest.fixture
def gate() -> DefaultPolicyGate:
    """The default gate with approval rules for pushes, MCP tools and writes under secrets/."""
    return DefaultPolicyGate(require_approval=RULES)


def asked(decision: object) -> Ask:
    """The decision as an Ask (fails the test for anything else)."""
    assert isinstance(decision, Ask), decision
    return decision


@pytest.mark.parametrize(
    "command",
    [
        "git push origin main",
        "git  push",
        "cd sub && git push origin feature",
        "git status; git push",
        "'git' push",
    ],
)
def test_push_is_held(gate: DefaultPolicyGate, command: str, tmp_path: Path) -> None:
    """A push, alone or as one command of several, is asked about, naming the rule."""
    decision = asked(decide(gate, tool("run_command", {"command": command}), context(tmp_path)))
    assert "require-approval" in decision.reason
    assert "'run_command:git push*'" in decision.reason


@pytest.mark.parametrize("command", ["git status", "echo git push", "git pull"])
def test_other_commands_are_allowed(gate: DefaultPolicyGate, command: str, tmp_path: Path) -> None:
    """Commands the rules do not match go through (``echo git push`` pushes nothing)."""
    assert isinstance(
        decide(gate, tool("run_command", {"command": command}), context(tmp_path)), Allow
    )


def test_deny_rules_win_over_approval(tmp_path: Path) -> None:
    """A call a deny rule refuses is denied, not put to a reviewer."""
    gate = DefaultPolicyGate(require_approval=["run_command:*"])
    decision = decide(gate, tool("run_command", {"command": "rm -rf /"}), context(tmp_path))
    assert isinstance(decision, Deny)


def test_mcp_kind_selects_server_tools(gate: DefaultPolicyGate, tmp_path: Path) -> None:
    """``mcp:*`` selects tools named ``<server>__<tool>`` and no built-in tool."""
    held = decide(gate, tool("github__create_issue", {"title": "x"}), context(tmp_path))
    assert asked(held).reason.startswith("rule 'require-approval' ('mcp:*')")
    assert isinstance(decide(gate, tool("file_list", {}), context(tmp_path)), Allow)


def test_file_tool_glob_is_over_its_path(gate: DefaultPolicyGate, tmp_path: Path) -> None:
    """A file tool's canonical argument string is its path."""
    ctx = context(tmp_path)
    asked(decide(gate, tool("file_write", {"path": "secrets/key", "content": "k"}), ctx))
    assert isinstance(
        decide(gate, tool("file_write", {"path": "a.txt", "content": "k"}), ctx), Allow
    )


def test_canonical_arguments_of_other_tools() -> None:
    """Any other tool's arguments are compact JSON with sorted keys."""
    assert canonical_arguments("web_fetch", {"url": "u", "a": 1}) == ['{"a":1,"url":"u"}']
    assert canonical_arguments("run_command", {"command": ["git", "push", "a b"]})[0] == (
        "git push a b"
    )


def test_respond_is_never_asked_about(gate: DefaultPolicyGate) -> None:
    """Approval rules are about tool calls only."""
    assert isinstance(decide(gate, respond(), context()), Allow)


def test_policy_refuses_a_rule_without_a_tool() -> None:
    """A rule that is not ``<tool>:<glob>`` fails validation naming the rule and the form."""
    with pytest.raises(ValidationError, match=r"require_approval rule 0 \('git push\*'\)"):
        PolicySpec(require_approval=["git push*"])
    with pytest.raises(ValidationError, match="does not use \\['require_approval'\\]"):
        PolicySpec(kind="permissive", require_approval=["run_command:*"])


def test_factory_builds_the_rules(tmp_path: Path) -> None:
    """``policy: {require_approval: [...]}`` reaches the default gate (behind the tool filter)."""
    gate = build_gate(PolicySpec(require_approval=RULES, allowed_tools=["run_command"]))
    asked(decide(gate, tool("run_command", {"command": "git push"}), context(tmp_path)))


class _Asking:
    async def evaluate_action(self, action: object, context: object) -> Ask:
        return Ask(reason="a human must see it")


class _Modifying:
    async def evaluate_action(self, action: ToolCallAction, context: object) -> Modify:
        return Modify(
            action=action.model_copy(update={"arguments": '{"command":"ls"}'}), reason="m"
        )


class _Denying:
    async def evaluate_action(self, action: object, context: object) -> Deny:
        return Deny(reason="no")


def test_composite_asks_unless_denied() -> None:
    """An Ask holds the call; a later Deny still wins; a modification before it is carried."""
    call = tool("run_command", {"command": "x"})
    assert (
        asked(decide(CompositeGate([_Asking(), PermissiveGate()]), call, context())).action is None
    )
    assert isinstance(decide(CompositeGate([_Asking(), _Denying()]), call, context()), Deny)
    held = asked(decide(CompositeGate([_Modifying(), _Asking()]), call, context()))
    assert held.action is not None and held.action.arguments == '{"command":"ls"}'  # type: ignore[union-attr]


CEDAR = """
@id("push-needs-a-human") @ask("pushing leaves the workspace")
permit(principal, action == Action::"tool_call", resource == Tool::"run_command")
when { context.arguments has command && context.arguments.command like "git push*" };
permit(principal, action, resource);
forbid(principal, action == Action::"tool_call", resource == Tool::"run_command")
when { context.arguments has command && context.arguments.command like "git push --force*" };
"""


def test_cedar_ask_annotation(tmp_path: Path) -> None:
    """A permit annotated ``@ask`` that allowed the request holds the call; a forbid wins."""
    path = tmp_path / "orga.cedar"
    path.write_text(CEDAR)
    gate = CedarGate([path])
    held = asked(decide(gate, tool("run_command", {"command": "git push origin"}), context()))
    assert "'push-needs-a-human' (orga.cedar): pushing leaves the workspace" in held.reason
    assert isinstance(decide(gate, tool("run_command", {"command": "ls"}), context()), Allow)
    forced = decide(gate, tool("run_command", {"command": "git push --force"}), context())
    assert isinstance(forced, Deny)


@pytest.fixture
def opa() -> Iterator[FakeOpaServer]:
    """A running fake OPA server."""
    with FakeOpaServer() as server:
        yield server


def test_opa_ask(opa: FakeOpaServer) -> None:
    """``{"allow": true, "ask": true}`` holds the call, with OPA's modified arguments when given;
    a non-boolean ``ask`` fails closed."""
    opa.set_decision("orga/approval", {"allow": True, "ask": True, "reason": "a push"})
    held = asked(decide(OpaGate(opa.url, "orga/approval"), tool("run_command"), context()))
    assert held.reason.startswith("a push") and held.action is None
    opa.set_decision(
        "orga/approval", {"allow": True, "ask": True, "modified_arguments": {"command": "ls"}}
    )
    held = asked(decide(OpaGate(opa.url, "orga/approval"), tool("run_command"), context()))
    assert isinstance(held.action, ToolCallAction)
    assert json.loads(held.action.arguments) == {"command": "ls"}
    opa.set_decision("orga/approval", {"allow": True, "ask": "yes"})
    assert isinstance(decide(OpaGate(opa.url, "orga/approval"), tool("x"), context()), Deny)
    opa.set_decision("orga/approval", {"allow": False, "ask": True})
    assert isinstance(decide(OpaGate(opa.url, "orga/approval"), tool("x"), context()), Deny)


PUSH_SCHEMA = {
    "type": "object",
    "properties": {"command": {"type": "string"}},
    "required": ["command"],
}


def test_gate_phase_holds_the_call(tmp_path: Path) -> None:
    """The Gate phase holds an asked call with its schema: neither approved nor denied, while
    the turn's other call is approved and an Ask about an answer is a denial."""
    config = LoopConfig(
        tool_definitions=[
            ToolDefinition(name="run_command", parameters=PUSH_SCHEMA),
            ToolDefinition(name="file_list"),
        ]
    )
    state = LoopState(agent_id="agent-1", conversation=Conversation())
    push = tool("run_command", {"command": "git push"}, call_id="c1")
    listing = tool("file_list", {}, call_id="c2")
    checking = PolicyCheck(state, config, [push, listing, respond()], Usage())
    gate = DefaultPolicyGate(require_approval=RULES)
    gated = asyncio.run(checking.check_policy(gate, context(tmp_path)))
    assert [c.call.call_id for c in gated.held] == ["c1"]
    assert gated.held[0].input_schema == PUSH_SCHEMA
    assert [getattr(a, "call_id", None) for a in gated.approved] == ["c2", None]
    assert gated.denied_count == 0
    asking = PolicyCheck(state, config, [respond()], Usage())
    gated = asyncio.run(asking.check_policy(CompositeGate([_Asking()]), context(tmp_path)))
    assert gated.denied_count == 1 and not gated.held


@pytest.mark.parametrize(
    "command",
    [
        "(git push)",
        "sudo git push",
        "sudo -u deploy -E git push origin main",
        'bash -c "git push"',
        "sh -xc 'git push origin'",
        "git -C repo push",
        "git -c user.name=x --git-dir=.git --work-tree=. push",
        "env git push",
        "env -i HOME=/tmp git push",
        "/usr/bin/git push",
        "GIT_DIR=. git push",
        "echo $(git push)",
        "echo `git push`",
        "{ git push; }",
        "nohup nice -n 5 timeout 10 command exec git push",
    ],
)
def test_push_bypasses_are_held(gate: DefaultPolicyGate, command: str, tmp_path: Path) -> None:
    """The ways around a glob over the raw line (finding 6) are each read as ``git push``."""
    decision = asked(decide(gate, tool("run_command", {"command": command}), context(tmp_path)))
    assert "'run_command:git push*'" in decision.reason


@pytest.mark.parametrize(
    "command", ["echo git push", "git status", "grep -r 'git push' docs", "bash -c 'git status'"]
)
def test_push_lookalikes_are_not_held(
    gate: DefaultPolicyGate, command: str, tmp_path: Path
) -> None:
    """Normalising does not make a mention of ``git push`` into one."""
    decision = decide(gate, tool("run_command", {"command": command}), context(tmp_path))
    assert not isinstance(decision, Ask), decision
