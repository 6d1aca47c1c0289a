"""``ActMode.AUTO`` (``tool_dispatch: auto``, the default): the reasoning worker runs an
iteration's calls itself when every one is of a read-only tool and the workspace exists, and
chains them to the tool workers otherwise."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from shared.conversation import Conversation, ConversationMessage
from shared.loop_types import LoopConfig
from shared.protocol import ActMode, Fence, ReasonedMessage, ReasonRequest
from shared.task_spec import ProviderSpec
from workers.handlers import onward, run_reasoning
from workers.runtime import local_core
from workers.tools.base import reads_only
from workers.tools.registry import default_registry

READ = {"name": "file_read", "arguments": {"path": "a.txt"}}
LIST = {"name": "file_list", "arguments": {"path": "."}}
WRITE = {"name": "file_write", "arguments": {"path": "b.txt", "content": "x"}}
COMMAND = {"name": "run_command", "arguments": {"command": "true"}}


def _request(workspace: Path, *calls: dict[str, Any]) -> ReasonRequest:
    conversation = Conversation()
    conversation.push(ConversationMessage.user("Goal: g"))
    return ReasonRequest(
        fence=Fence(task_id="t", step_id="s", iteration=0, attempt=1),
        agent_id="a",
        conversation=conversation,
        config=LoopConfig(),
        provider=ProviderSpec(kind="scripted", replies=[{"tool_calls": list(calls)}]),
        workspace=str(workspace),
        act=ActMode.AUTO,
    )


def _reason(request: ReasonRequest) -> ReasonedMessage:
    async def go() -> ReasonedMessage:
        core = local_core()
        try:
            return await run_reasoning(request, core)
        finally:
            await core.aclose()

    return asyncio.run(go())


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "a.txt").write_text("first line\n")
    return tmp_path


def test_only_the_reading_tools_say_they_only_read() -> None:
    """file_read, file_list and recall_knowledge read; every other built-in tool may write or
    run code (or, like grep, take unbounded CPU), so it is not run next to the model key."""
    registry = default_registry()
    assert sorted(t.definition.name for t in registry if reads_only(t)) == [
        "file_list",
        "file_read",
    ]
    core = local_core()
    try:
        assert core.reads_only("recall_knowledge") and not core.reads_only("store_knowledge")
        assert not core.reads_only("run_command") and not core.reads_only("no_such_tool")
    finally:
        asyncio.run(core.aclose())


def test_read_only_calls_run_in_the_reasoning_worker(workspace: Path) -> None:
    """Two reads: both run here, their outcomes travel in ``acted``, nothing is chained."""
    message = _reason(_request(workspace, READ, LIST))
    assert message.acted is not None and message.chained == []
    by_call = {o.fence.call_id: o.observation for o in message.acted}
    read, listed = (by_call[c.call_id] for c in message.approved_calls)
    assert "first line" in read.content and not read.is_error
    assert "a.txt" in listed.content
    sent_on, tool_requests = onward(_request(workspace, READ, LIST), message)
    assert sent_on is message and tool_requests == []


@pytest.mark.parametrize("other", [WRITE, COMMAND], ids=["file_write", "run_command"])
def test_a_turn_with_any_other_call_is_chained_whole(
    workspace: Path, other: dict[str, Any]
) -> None:
    """One write or command among the reads: every call goes to the tool workers, as CHAIN."""
    request = _request(workspace, READ, other)
    message = _reason(request)
    assert message.acted is None
    assert message.chained == [c.call_id for c in message.approved_calls]
    _, tool_requests = onward(request, message)
    assert [r.action.name for r in tool_requests] == ["file_read", other["name"]]
    assert not (workspace / "b.txt").exists()  # nothing ran here


def test_reads_of_a_workspace_not_created_yet_go_to_a_tool_worker(tmp_path: Path) -> None:
    """Creating the workspace (or copying its template in) is a tool worker's job: the
    reasoning worker may have the workspaces mounted read-only."""
    missing = tmp_path / "not-yet"
    request = _request(missing, READ)
    message = _reason(request)
    assert message.acted is None and message.chained == [message.approved_calls[0].call_id]
    assert not missing.exists()


def test_inline_dispatch_never_runs_a_command_next_to_the_model_key(workspace: Path) -> None:
    """``tool_dispatch: inline`` runs a write here, but a turn with a ``run_command`` goes to
    the coordinator, which sends it to the tool workers: the reasoning worker, which holds the
    model key, is never the ancestor of an agent's command."""
    write = _reason(_request(workspace, WRITE).model_copy(update={"act": ActMode.INLINE}))
    assert write.acted is not None and (workspace / "b.txt").exists()
    marker = workspace / "ran"
    command = {"name": "run_command", "arguments": {"command": f"touch {marker}"}}
    inline = _request(workspace, READ, command).model_copy(update={"act": ActMode.INLINE})
    message = _reason(inline)
    assert message.acted is None and message.chained == []
    assert not marker.exists()


def test_a_read_run_inline_is_checked_against_its_schema_once(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An inline read passed the gate's schema pre-check against the registry's own schema:
    the tool does not check it again; a schema the task offers in its place that differs
    (or a tool run without that check) is checked by the tool."""
    from workers.handlers import checked_schemas
    from workers.tools.arguments import ArgumentCheck

    checks: list[str] = []
    real = ArgumentCheck.failure

    def counted(self: ArgumentCheck, arguments: Any, **metadata: str) -> Any:
        checks.append(str(arguments))
        return real(self, arguments, **metadata)

    monkeypatch.setattr(ArgumentCheck, "failure", counted)
    message = _reason(_request(workspace, READ))
    assert message.acted is not None and "first line" in message.acted[0].observation.content
    assert checks == []
    registry = default_registry().definitions()
    read = next(d for d in registry if d.name == "file_read")
    equal = read.model_copy(update={"parameters": dict(read.parameters)})
    other = read.model_copy(update={"parameters": {**read.parameters, "required": []}})
    assert checked_schemas([equal], registry) == {"file_read": read.parameters}
    assert checked_schemas([other], registry) == {}


def test_an_inline_call_is_checked_by_the_tool_under_the_draft_its_check_follows(
    workspace: Path,
) -> None:
    """Review of branch ``worker``: the gate's pre-check follows a schema's ``$schema`` (draft-07
    here, where a keyword beside ``$ref`` is ignored), the tool's own check is Draft 2020-12
    (where it applies): the pre-check of the registry's own schema does not stand for the
    tool's, and arguments the tool's schema refuses must not reach its ``work``."""
    from collections.abc import Mapping

    from shared.inference import ToolDefinition
    from workers.tools.arguments import BlockingTool
    from workers.tools.base import ToolContext, ToolOutput
    from workers.tools.output import error_output

    worked: list[Mapping[str, Any]] = []

    class Named(BlockingTool):
        DEFINITION = ToolDefinition(
            name="named_read",
            description="read a name that starts with a letter",
            parameters={
                "$schema": "http://json-schema.org/draft-07/schema#",
                "type": "object",
                "definitions": {"name": {"type": "string"}},
                "properties": {"name": {"$ref": "#/definitions/name", "pattern": "^[a-z]"}},
                "required": ["name"],
            },
        )
        KIND = "named_read"
        read_only = True

        def work(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
            worked.append(dict(arguments))
            return error_output("worked", error_type="worked")

    registry = default_registry()
    registry.register(Named())
    call = {"name": "named_read", "arguments": {"name": "../../etc/passwd"}}
    request = _request(workspace, call).model_copy(update={"act": ActMode.INLINE})

    async def go() -> ReasonedMessage:
        core = local_core(registry=registry)
        try:
            return await run_reasoning(request, core)
        finally:
            await core.aclose()

    message = asyncio.run(go())
    assert message.acted is not None, message
    assert worked == [], worked
    assert "does not match" in message.acted[0].observation.content


def test_a_schema_is_the_tool_s_own_only_by_its_json_text_and_draft() -> None:
    """``1 == True`` in Python, not in JSON Schema: an offered schema equal to the registry's
    by ``==`` but not by its JSON text, or a registry schema under another ``$schema`` draft
    than the tool's Draft 2020-12, is checked by the tool again."""
    from shared.inference import ToolDefinition
    from workers.handlers import checked_schemas

    def tool(parameters: dict[str, Any]) -> ToolDefinition:
        return ToolDefinition(name="t", description="t", parameters=parameters)

    own = tool({"type": "object", "properties": {"n": {"const": 1}}})
    as_true = tool({"type": "object", "properties": {"n": {"const": True}}})
    assert as_true.parameters == own.parameters
    assert checked_schemas([as_true], [own]) == {}
    assert checked_schemas([own], [own]) == {"t": own.parameters}
    for draft in (
        "http://json-schema.org/draft-07/schema#",
        "https://json-schema.org/draft/2019-09/schema",
    ):
        other = tool({"$schema": draft, "type": "object"})
        assert checked_schemas([other], [other]) == {}, draft
    latest = tool({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"})
    assert checked_schemas([latest], [latest]) == {"t": latest.parameters}
