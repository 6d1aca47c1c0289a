"""The ``delegate`` tool on the workers: offered like any tool, gated as a delegation too, never
chained to a tool worker or run inline, and refused by a tool worker handed one by mistake."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from shared.actions import ToolCallAction
from shared.conversation import Conversation, ConversationMessage
from shared.loop_types import LoopConfig
from shared.policy import PolicySpec
from shared.protocol import ActMode, Fence, ReasonRequest, ToolRequest
from shared.task_spec import ProviderSpec
from workers.handlers import onward, run_reasoning, run_tool_call
from workers.runtime import local_core

READ = {"name": "file_read", "arguments": {"path": "a.txt"}}


def _delegate(agent: str = "alpha") -> dict[str, Any]:
    return {"name": "delegate", "arguments": {"agent": agent, "goal": "help"}}


def _request(tmp_path: Path, *calls: dict[str, Any], **fields: Any) -> ReasonRequest:
    conversation = Conversation()
    conversation.push(ConversationMessage.user("Goal: g"))
    return ReasonRequest(
        fence=Fence(task_id="t", step_id="s", iteration=0, attempt=1),
        agent_id="a",
        conversation=conversation,
        config=fields.pop("config", LoopConfig()),
        provider=ProviderSpec(kind="scripted", replies=[{"tool_calls": list(calls)}]),
        workspace=str(tmp_path),
        **fields,
    )


def _reason(request: ReasonRequest) -> Any:
    async def go() -> Any:
        core = local_core()
        try:
            return await run_reasoning(request, core)
        finally:
            await core.aclose()

    return asyncio.run(go())


def test_delegate_is_offered_with_its_schema_and_approved(tmp_path: Path) -> None:
    """A delegate call with valid arguments passes the schema check and the default gate."""
    message = _reason(_request(tmp_path, _delegate(), act=ActMode.COORDINATOR))
    assert [c.name for c in message.approved_calls] == ["delegate"]
    assert message.denied_count == 0


def test_a_delegation_is_never_chained_and_never_run_inline(tmp_path: Path) -> None:
    """CHAIN sends only the other calls to the tool workers; INLINE runs nothing itself when
    the iteration delegates (the coordinator dispatches it all)."""
    chained = _reason(_request(tmp_path, READ, _delegate(), act=ActMode.CHAIN))
    assert [c.name for c in chained.approved_calls] == ["file_read", "delegate"]
    assert chained.chained == [chained.approved_calls[0].call_id]
    request = _request(tmp_path, READ, _delegate(), act=ActMode.CHAIN)
    message, sent = onward(request, chained)
    assert message is not None and [r.action.name for r in sent] == ["file_read"]
    inline = _reason(_request(tmp_path, READ, _delegate(), act=ActMode.INLINE))
    assert inline.acted is None and inline.chained == []


def test_a_lone_delegation_goes_back_to_the_coordinator(tmp_path: Path) -> None:
    """Chained mode with only a delegation: nothing is sent to a tool worker."""
    request = _request(tmp_path, _delegate(), act=ActMode.CHAIN)
    message, sent = onward(request, _reason(request))
    assert message is not None and sent == []


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [({"agent": "alpha"}, "goal"), ({"agent": "a b", "goal": "g"}, "agent")],
)
def test_invalid_delegate_arguments_are_fed_back_by_the_schema_check(
    tmp_path: Path, arguments: dict[str, Any], expected: str
) -> None:
    """The schema the model sees is enforced before the gate."""
    call = {"name": "delegate", "arguments": arguments}
    message = _reason(_request(tmp_path, call))
    assert message.approved_calls == [] and message.denied_count == 1
    assert expected in message.new_messages[-1].content


def test_the_gate_judges_a_delegate_call_as_a_delegation(tmp_path: Path) -> None:
    """The default gate's delegation-depth rule applies to a delegate call at the task's depth."""
    config = LoopConfig(delegation_depth=3)
    message = _reason(_request(tmp_path, _delegate("deep"), config=config,
                               policy=PolicySpec(kind="default")))  # fmt: skip
    assert message.approved_calls == []
    assert "rule 'delegation-depth': delegating to 'deep' would reach depth 4" in (
        message.new_messages[-1].content
    )


def test_an_allow_list_without_delegate_hides_and_refuses_it(tmp_path: Path) -> None:
    """A task whose tools leave delegate out neither offers nor approves it."""
    message = _reason(_request(tmp_path, _delegate(), allowed_tools=["file_read"]))
    assert message.approved_calls == []
    assert "'delegate' is not offered in this task" in message.new_messages[-1].content


def test_a_tool_worker_handed_a_delegation_refuses_it(tmp_path: Path) -> None:
    """The tool itself does nothing but say the coordinator decides it."""
    call = ToolCallAction(call_id="c", name="delegate",
                          arguments=json.dumps({"agent": "a", "goal": "g"}))  # fmt: skip
    request = ToolRequest(
        fence=Fence(task_id="t", step_id="s", iteration=1, attempt=1, call_id="c"),
        agent_id="a", action=call, workspace=str(tmp_path), config=LoopConfig(),
    )  # fmt: skip

    async def go() -> Any:
        core = local_core()
        try:
            return await run_tool_call(request, core)
        finally:
            await core.aclose()

    observed = asyncio.run(go())
    assert observed.observation.is_error
    assert "delegate is decided by the coordinator" in observed.observation.content
