"""The in-process driver resolves ``agent: NAME`` from the agents it is given, as the intake
does from the registry."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from coordinator.machine import MachineSettings
from coordinator.state import TaskStatus
from orga.inprocess import InProcessDriver
from shared.agent_profile import parse_agent
from shared.task_spec import TaskSpecError, parse_task
from workers.runtime import local_core

ANSWERER = parse_agent(
    {"name": "answerer", "provider": {"kind": "scripted", "replies": ["the answer"]},
     "system_prompt": "Answer briefly.", "limits": {"max_iterations": 3}}
)  # fmt: skip

TASK = {"goal": "answer", "agent": "answerer", "steps": [{"id": "s", "instruction": "answer"}]}


def _driver(tmp_path: Path) -> InProcessDriver:
    return InProcessDriver(
        local_core(),
        MachineSettings(workspace_root=str(tmp_path)),
        agents={"answerer": ANSWERER},
    )


def test_a_task_naming_an_agent_runs_with_its_profile(tmp_path: Path) -> None:
    """The profile's provider, prompt and limits are merged under the task, which completes."""
    run = asyncio.run(_driver(tmp_path).run(dict(TASK)))
    assert run.status == TaskStatus.COMPLETED, run.result()
    spec = run.record.spec
    assert spec.agent_id == "answerer"
    assert spec.system_prompt == "Answer briefly."
    assert spec.limits.max_iterations == 3


def test_a_parsed_task_naming_an_agent_is_merged_too(tmp_path: Path) -> None:
    """A TaskSpec naming an agent (from load_task_file) gets the profile's fields it left unset."""
    run = asyncio.run(_driver(tmp_path).run(parse_task(TASK)))
    assert run.record.spec.provider.kind == "scripted"
    assert run.status == TaskStatus.COMPLETED, run.result()


def test_an_unknown_agent_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    """A name the driver was not given is a TaskSpecError, as at the intake."""
    with pytest.raises(TaskSpecError, match=r"'nobody' is not a registered agent; known agents: "):
        asyncio.run(_driver(tmp_path).run("goal: g\nagent: nobody\n"))
