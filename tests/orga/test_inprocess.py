"""The in-process driver: the coordinator's machine and the workers' run_dispatch in one
process; what it does where the distributed runtime would use a deadline."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from coordinator.liveness import LivenessSettings
from coordinator.machine import MachineSettings
from coordinator.state import TaskStatus
from orga.inprocess import InProcessDriver
from workers.runtime import local_core


def test_a_hung_call_is_given_up_at_start_to_close_and_the_task_ends(tmp_path: Path) -> None:
    """A tool call that never returns is cancelled past start-to-close and re-sent, then given
    up, as a coordinator does with a dispatch it has lost: the run returns."""
    hang = {"name": "run_command", "arguments": {"command": "sleep 600"}}
    task = {
        "goal": "hang",
        "provider": {"kind": "scripted", "replies": [{"tool_calls": [hang]}] * 3 + ["done"]},
        "steps": [{"id": "s", "instruction": "x"}],
        "limits": {"tool_timeout": "20m"},
        "step_iteration": {"max_reattempts_per_step": 1},
    }
    settings = MachineSettings(
        workspace_root=str(tmp_path),
        observation_deadline_s=0.2,
        max_redeliveries=1,
        liveness=LivenessSettings(heartbeat_timeout_s=0.2, start_to_close_s=0.5),
    )
    started = time.monotonic()
    run = asyncio.run(InProcessDriver(local_core(), settings).run(task))
    assert time.monotonic() - started < 30
    assert run.status is TaskStatus.FAILED
    assert [e for e in run.events if e["event"] == "redispatched"]
    assert any(e.event.type == "AttemptFailed" for e in run.journal)
