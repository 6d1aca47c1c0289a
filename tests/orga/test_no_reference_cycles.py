"""A model call leaves no reference cycle behind: the objects of one input applied by the
coordinator's machine (the machine, its sections, its effects) and of one batch of tool calls
(the executor's batch, its recovery environment) are freed when they are dropped, not left to
the garbage collector, whose collections took 0.17-0.23 ms of CPU per model call in each of
the coordinator and the reasoning worker with them (docs/performance.md, "no reference cycle
per call").

A whole task runs on the in-process driver (the coordinator's machine and the workers'
``run_dispatch``), reading a file and writing one, with the collector off and every object
it would have freed kept for inspection (``gc.DEBUG_SAVEALL``)."""

from __future__ import annotations

import asyncio
import gc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.machine import MachineSettings
from coordinator.machine.core import Effects, Section
from coordinator.machine.task import TaskMachine
from coordinator.state import TaskStatus
from orga.inprocess import InProcessDriver
from workers.runtime import local_core

OURS = (TaskMachine, Section, Effects)


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def test_a_task_leaves_no_machine_or_batch_to_the_collector(
    tmp_path: Path, collector_off: None
) -> None:
    (tmp_path / "notes.txt").write_text("a line\n" * 40)
    read = {"name": "file_read", "arguments": {"path": "notes.txt"}}
    write = {"name": "file_write", "arguments": {"path": "out.txt", "content": "x"}}
    # A command past its timeout is a failed call: its batch builds a recovery environment.
    slow = {"name": "run_command", "arguments": {"command": "sleep 30"}}
    task = {
        "goal": "read and write",
        "workspace": str(tmp_path),
        "provider": {
            "kind": "scripted",
            "replies": [
                {"tool_calls": [read]},
                {"tool_calls": [write]},
                {"tool_calls": [slow]},
                "done",
            ],
        },
        "steps": [{"id": "s", "instruction": "x"}],
        "limits": {"tool_timeout": "1s"},
    }
    settings = MachineSettings(workspace_root=str(tmp_path))
    run = asyncio.run(InProcessDriver(local_core(), settings).run(task))
    assert run.status is TaskStatus.COMPLETED
    assert (tmp_path / "out.txt").read_text() == "x"
    del run
    gc.collect()
    left = Counter(
        type(o).__qualname__
        for o in gc.garbage
        if isinstance(o, OURS) or type(o).__module__ in ("workers.executor", "workers.recovery")
    )
    assert left == Counter(), f"left to the garbage collector: {dict(left)}"


def test_the_check_sees_a_cycle_when_there_is_one(collector_off: None) -> None:
    """The inspection above finds such objects when a cycle holds them (a section kept by
    its machine, as before :meth:`TaskMachine.release_sections`)."""
    machine = TaskMachine.__new__(TaskMachine)
    machine.__dict__["steps"] = Section(machine)
    del machine
    gc.collect()
    assert any(isinstance(o, TaskMachine) for o in gc.garbage)
