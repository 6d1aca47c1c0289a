"""MCP tools in the loop, on the in-process driver with a real SDK server over stdio: an MCP
result is an observation the stagnation detector counts, and a failing server goes through
the recovery strategy and trips the tool's circuit breaker."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from coordinator.machine import MachineSettings
from coordinator.state import TaskStatus
from orga.inprocess import InProcessDriver, InProcessRun
from tests.fakes.mcp_http import stdio_command
from workers.runtime import local_core


def _run(tmp_path: Path, calls: list[dict[str, Any]], **extra: Any) -> InProcessRun:
    task = {
        "goal": "use the fake server",
        "idempotency_key": None,
        "provider": {
            "kind": "scripted",
            "replies": [{"tool_calls": [call]} for call in calls] + ["done"],
        },
        "steps": [{"id": "s", "instruction": "call it"}],
        "mcp_servers": [{"name": "fake", "command": stdio_command()}],
        "limits": {"max_iterations": len(calls) + 2, "tool_timeout": "20s"},
        **extra,
    }

    async def scenario() -> InProcessRun:
        core = local_core()
        try:
            driver = InProcessDriver(core, MachineSettings(workspace_root=str(tmp_path)))
            return await driver.run(task)
        finally:
            await core.aclose()

    return asyncio.run(scenario())


def _tool_messages(run: InProcessRun) -> list[str]:
    return [m.content for m in run.record.conversation.messages if m.role == "tool"]


def test_the_same_mcp_result_again_and_again_is_stagnation(tmp_path: Path) -> None:
    """Calling one MCP tool for the same answer over and over raises the stagnation detector
    (here: escalated to a review), as with any other tool."""
    echo = {"name": "fake__echo", "arguments": {"text": "same"}}
    run = _run(tmp_path, [echo] * 12)
    assert any(e.event.type == "StagnationDetected" for e in run.journal)
    assert run.status is TaskStatus.AWAITING_REVIEW
    assert set(_tool_messages(run)) == {"echo: same"}


def test_a_failing_server_is_recovered_and_trips_its_breaker(tmp_path: Path) -> None:
    """A server that crashes on every call: each call is retried by the recovery strategy
    (RecoveryTriggered names the server and tool), the failures count on the breaker of
    fake__crash, and once it is open the calls are refused without starting the server."""
    crash = {"name": "fake__crash", "arguments": {}}
    run = _run(
        tmp_path,
        [crash] * 3,
        tool_recovery={
            "fake__crash": {"strategy": "retry", "max_attempts": 2, "base_delay": "10ms"}
        },
    )
    recoveries = [e.event for e in run.journal if e.event.type == "RecoveryTriggered"]
    assert recoveries and all(getattr(e, "tool_name", "") == "fake__crash" for e in recoveries)
    assert "MCP server 'fake'" in getattr(recoveries[0], "error", "")
    messages = _tool_messages(run)
    assert "MCP server 'fake'" in messages[0] and "Connection closed" in messages[0]
    assert "circuit is open" in messages[-1]
