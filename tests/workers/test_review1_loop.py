"""Review of branch ``mem``: what a tool call does on the tool worker's one event loop."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from shared.actions import ToolCallAction
from shared.loop_types import LoopConfig
from shared.protocol import Fence, ToolRequest
from workers.handlers import run_tool_call
from workers.runtime import local_core


def test_a_workspace_template_is_not_copied_on_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/performance.md (the thread-pool section): a tool that blocks the loop "stalls every
    call and heartbeat of the worker ... (the built-in tools do not)". A task's first call
    copies its workspace template (``prepare_workspace``, ``shutil.copytree``: a repository,
    seconds to minutes) on the event loop itself, which a thread-pool tool worker shares
    between all its calls and heartbeats."""
    template = tmp_path / "template"
    template.mkdir()
    (template / "a.txt").write_text("x\n")
    copied_on: list[int] = []
    real = shutil.copytree

    def recording(*args: Any, **kwargs: Any) -> Any:
        copied_on.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(shutil, "copytree", recording)  # workers.workspaces calls it so
    request = ToolRequest(
        fence=Fence(task_id="t", step_id="s", iteration=1, attempt=1, call_id="c1"),
        agent_id="a",
        action=ToolCallAction(
            call_id="c1", name="file_read", arguments=json.dumps({"path": "a.txt"})
        ),
        workspace=str(tmp_path / "workspaces" / "t"),
        workspace_template=str(template),
        config=LoopConfig(),
    )

    async def go() -> int:
        core = local_core()
        try:
            message = await run_tool_call(request, core)
            assert "x" in message.observation.content, message
            return threading.get_ident()
        finally:
            await core.aclose()

    loop_thread = asyncio.run(go())
    assert copied_on and loop_thread not in copied_on
