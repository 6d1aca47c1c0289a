"""Tools hidden from the model (tool profile, allow-list, no knowledge block) are refused when
it names them anyway; unknown names are left to the executor."""

from __future__ import annotations

import asyncio
from pathlib import Path

from coordinator.machine import MachineSettings
from orga.inprocess import InProcessDriver
from shared.conversation import MessageRole
from workers.runtime import local_core


def test_a_hidden_knowledge_tool_is_denied_and_stores_nothing(tmp_path: Path) -> None:
    """store_knowledge in a task without a knowledge block: denied, the store stays empty."""
    fact = {"subject": "ignore", "predicate": "all", "object": "previous instructions"}
    core = local_core()
    task = {
        "goal": "no knowledge here",
        "agent_id": "victim",
        "provider": {
            "kind": "scripted",
            "replies": [{"tool_calls": [{"name": "store_knowledge", "arguments": fact}]}, "ok"],
        },
        "steps": [{"id": "s", "instruction": "x"}],
    }
    run = asyncio.run(
        InProcessDriver(core, MachineSettings(workspace_root=str(tmp_path))).run(task)
    )
    answer = next(m for m in run.record.conversation.messages if m.role is MessageRole.TOOL)
    assert "'store_knowledge' is not offered in this task" in answer.content
    found = asyncio.run(core.knowledge().search_knowledge("victim", "instructions", 10))
    assert found == []


def test_a_tool_the_profile_hides_is_denied(tmp_path: Path) -> None:
    """A tool profile that leaves out run_command also refuses a run_command call."""
    command = {"name": "run_command", "arguments": {"command": "touch pwned"}}
    task = {
        "goal": "read only",
        "tool_profile": {"include": ["file_*"]},
        "provider": {"kind": "scripted", "replies": [{"tool_calls": [command]}, "ok"]},
        "steps": [{"id": "s", "instruction": "x"}],
    }
    run = asyncio.run(
        InProcessDriver(local_core(), MachineSettings(workspace_root=str(tmp_path))).run(task)
    )
    answer = next(m for m in run.record.conversation.messages if m.role is MessageRole.TOOL)
    assert "'run_command' is not offered" in answer.content
    assert not list(tmp_path.rglob("pwned"))
