"""Which Celery workers a deployment runs, and with what: the reasoning and the tool roles.

Reasoning is I/O-bound: a model call waits seconds on the network. A reasoning worker runs
:class:`workers.pool.LoopPool` (``-P custom``, ``CELERY_CUSTOM_WORKER_POOL``) with
``ORGA_REASONING_CONCURRENCY`` (200) tasks at once, each an asyncio task on the process's one
event loop (:mod:`workers.runtime`): 200 model calls in flight cost one process and 200
requests, no thread per call (``-P threads`` still works, at more CPU per call).

Tool calls may burn CPU or block: a tool worker runs the prefork pool with
``ORGA_TOOL_CONCURRENCY`` processes (2), and never sees a model key (its environment is
stripped of every key variable), so that no agent command inherits one. That is not isolation
from a process of the same user that holds the key: with ``--role all`` the supervisor and the
reasoning workers keep it in their environment (``/proc/PID/environ``, readable by the same
user). To keep a key from the agents' commands, run the tool workers as another user or in
another container, as the compose file does.

This module builds the commands only (no Celery import): ``orga worker`` and the embedded
runtime start them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from shared import keys
from shared.settings import OrgaSettings
from workers import supervisor

POOL_PATH = "workers.pool:LoopPool"
"""The reasoning worker's pool (``-P custom``): :class:`workers.pool.LoopPool`, named here
without importing Celery."""

__all__ = [
    "MODEL_KEY_VARIABLES",
    "Role",
    "WorkerCommand",
    "start",
    "stop",
    "supervisor_exec",
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
    """What a worker serves: ``all`` starts the workers of both other roles."""

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
    *,
    prefix: str = "",
) -> list[WorkerCommand]:
    """The workers ``role`` stands for: ``ORGA_REASONING_PROCESSES`` reasoning workers for
    ``reasoning``, one tool worker for ``tools``, both for ``all``.

    One worker of one role is named ``name`` (Celery's default when None). Otherwise each is
    named ``<prefix><role>[<n>]-<pid>@%h``, ``<n>`` numbering the reasoning workers when there
    are several: node names must differ for Celery's remote control and for Flower."""
    roles = (Role.REASONING, Role.TOOLS) if role is Role.ALL else (role,)
    counts = {Role.REASONING: settings.reasoning_processes, Role.TOOLS: 1}
    if role is not Role.ALL and counts[role] == 1:
        return [worker_command(role, settings, environ, extra, name)]
    return [
        worker_command(
            each,
            settings,
            environ,
            extra,
            f"{prefix}{each.value}{n if counts[each] > 1 else ''}-{os.getpid()}@%h",
        )
        for each in roles
        for n in range(1, counts[each] + 1)
    ]


def start(
    commands: Sequence[WorkerCommand], output: int | None = None
) -> list[subprocess.Popen[bytes]]:
    """Start ``commands``; ``output`` (a file descriptor) receives their stdout and stderr."""
    return supervisor.start([supervisor.Child(c.argv, c.env) for c in commands], output)


def stop(
    processes: Sequence[subprocess.Popen[bytes]], timeout_s: float = supervisor.STOP_TIMEOUT_S
) -> None:
    """SIGTERM (Celery's warm shutdown) each process, SIGKILL those still alive after
    ``timeout_s``."""
    supervisor.stop(processes, timeout_s)


def supervisor_exec(
    commands: Sequence[WorkerCommand], environ: Mapping[str, str]
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of :mod:`workers.supervisor` running ``commands``: what
    ``orga worker`` executes instead of itself when it starts more than one worker.
    ``environ`` is its own environment, from which each command's is derived."""
    children = [supervisor.Child(c.argv, c.env) for c in commands]
    env = {**environ, supervisor.COMMANDS_VARIABLE: supervisor.encode(children, environ)}
    return [sys.executable, "-m", "workers.supervisor"], env
