"""Which Celery workers a deployment runs, and with what: the reasoning and the tool roles.

Reasoning is I/O-bound: a model call waits seconds on the network. A reasoning worker runs
:class:`workers.pool.LoopPool` (``-P custom``, ``CELERY_CUSTOM_WORKER_POOL``) with
``ORGA_REASONING_CONCURRENCY`` (200) tasks at once, each an asyncio task on the process's one
event loop (:mod:`workers.runtime`): 200 model calls in flight cost one process and 200
requests, no thread per call (``-P threads`` still works, at more CPU per call).

Tool calls may burn CPU or block: a tool worker runs the prefork pool with
``ORGA_TOOL_CONCURRENCY`` processes (2), and never sees a model key (its environment is
stripped of every key variable), so that no agent command runs in a process tree that holds
one.

This module builds the commands only (no Celery import): ``orga worker`` and the embedded
runtime start them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from shared import keys
from shared.settings import OrgaSettings

POOL_PATH = "workers.pool:LoopPool"
"""The reasoning worker's pool (``-P custom``): :class:`workers.pool.LoopPool`, named here
without importing Celery."""

__all__ = [
    "MODEL_KEY_VARIABLES",
    "Role",
    "WorkerCommand",
    "start",
    "stop",
    "supervise",
    "worker_command",
    "worker_commands",
]

MODEL_KEY_VARIABLES = frozenset(
    {
        "ORGA_API_KEY",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "OPENROUTER_API_KEY",
        "ORGA_LIVE_API_KEY",
    }
)
"""Environment variables that can hold a model key: never passed to a tool worker."""


class Role(StrEnum):
    """What a worker serves: ``all`` starts one worker of each of the other two."""

    ALL = "all"
    REASONING = "reasoning"
    TOOLS = "tools"


@dataclass(frozen=True, slots=True)
class WorkerCommand:
    """One Celery worker process to start: its argv and its environment."""

    role: Role
    argv: list[str]
    env: dict[str, str]


def worker_command(
    role: Role,
    settings: OrgaSettings,
    environ: Mapping[str, str],
    extra: Sequence[str] = (),
    name: str | None = None,
) -> WorkerCommand:
    """The command of one reasoning or tool worker; ``extra`` (Celery's own options) last,
    so that an operator's ``-c`` or ``-P`` wins."""
    if role is Role.ALL:
        raise ValueError("worker_command takes one role; use worker_commands for 'all'")
    reasoning = role is Role.REASONING
    queue = keys.reasoning_queue if reasoning else keys.tools_queue
    default = settings.reasoning_concurrency if reasoning else settings.tool_concurrency
    concurrency = settings.worker_concurrency or default
    argv = [
        sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q", queue,
        "-P", "custom" if reasoning else "prefork", "-c", str(concurrency),
        "--loglevel", "INFO",
    ]  # fmt: skip
    if name is not None:
        argv += ["-n", name]
    env = dict(environ)
    if reasoning:
        env["CELERY_CUSTOM_WORKER_POOL"] = POOL_PATH
    else:
        for variable in MODEL_KEY_VARIABLES:
            env.pop(variable, None)
    return WorkerCommand(role=role, argv=[*argv, *extra], env=env)


def worker_commands(
    role: Role,
    settings: OrgaSettings,
    environ: Mapping[str, str],
    extra: Sequence[str] = (),
    name: str | None = None,
) -> list[WorkerCommand]:
    """The workers ``role`` stands for: one, or (``all``) a reasoning and a tool worker, each
    named ``<role>@<host>`` unless ``name`` is given for a single role."""
    if role is not Role.ALL:
        return [worker_command(role, settings, environ, extra, name)]
    return [
        worker_command(each, settings, environ, extra, f"{each.value}-{os.getpid()}@%h")
        for each in (Role.REASONING, Role.TOOLS)
    ]


def start(
    commands: Sequence[WorkerCommand], output: int | None = None
) -> list[subprocess.Popen[bytes]]:
    """Start ``commands``; ``output`` (a file descriptor) receives their stdout and stderr."""
    stderr = subprocess.STDOUT if output is not None else None
    return [subprocess.Popen(c.argv, env=c.env, stdout=output, stderr=stderr) for c in commands]


def stop(processes: Sequence[subprocess.Popen[bytes]], timeout_s: float = 10.0) -> None:
    """SIGTERM (Celery's warm shutdown) each process, SIGKILL those still alive after
    ``timeout_s``."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + timeout_s
    for process in processes:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def supervise(commands: Sequence[WorkerCommand]) -> int:
    """Run ``commands`` until one exits or this process is told to stop (SIGTERM, SIGINT),
    then stop the others; the exit code is the first one to exit's (0 when told to stop)."""
    processes = start(commands)
    stopping: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        stopping.append(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    code = 0
    while not stopping:
        exited = [p for p in processes if p.poll() is not None]
        if exited:
            code = exited[0].returncode or 1
            break
        time.sleep(0.2)
    stop(processes)
    return code
