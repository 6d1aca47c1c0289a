"""Which Celery workers a deployment runs, and with what: the reasoning and the tool roles.

Reasoning is I/O-bound: a model call waits seconds on the network. A reasoning worker runs
:class:`workers.pool.LoopPool` (``-P custom``, ``CELERY_CUSTOM_WORKER_POOL``) with
``ORGA_REASONING_CONCURRENCY`` (200) tasks at once, each an asyncio task on the process's one
event loop (:mod:`workers.runtime`): 200 model calls in flight cost one process and 200
requests, no thread per call (``-P threads`` still works, at more CPU per call).

A tool call's work runs outside the event loop (a command in processes of its own, a file tool
in a worker thread: :mod:`workers.tools`): a tool worker runs Celery's thread pool with
``ORGA_TOOL_CONCURRENCY`` threads (2) in one process, each handing its call to the process's
event loop; ``ORGA_TOOL_POOL=prefork`` runs a process per call instead (tools that burn CPU in
Python, or that may crash the interpreter: a dead pool process is replaced, the worker stays
up), at about 35 MB more (docs/performance.md, issue 27). A tool worker never sees a model key.
No worker has a model key in its environment: each reasoning worker gets the keys through a
socket of its own (:mod:`workers.key_handoff`), so neither the supervisor of ``--role all`` nor
the ``orga run`` that starts the embedded runtime, both ancestors of every agent command, holds
one in its ``/proc/PID/environ``. Nor does any worker's or the supervisor's environment hold the
serving side's secrets (:data:`workers.key_handoff.PROCESS_SECRET_VARIABLES`: API tokens,
webhooks, the inbox's credentials), which no worker needs, nor the connection URLs
(``ORGA_REDIS_URL``, ``ORGA_BROKER_URL``, a password in them): each worker gets them through a
socket of its own (:data:`workers.key_handoff.CONNECTION_FD_VARIABLE`). That is not isolation
from a process of the same user that may read the reasoning worker's memory (``ptrace``, when
the system's Yama policy allows it): to keep a key from the agents' commands against that too,
run the tool workers as another user or in another container, as the compose file does.

This module builds the commands only (no Celery import): ``orga worker`` and the embedded
runtime start them. Each is ``python -m orga.worker_main``, Celery's ``celery -A orga worker``
without Celery's command group and its plugins (about 12 MB less per worker process).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from orga import supervisor
from shared import keys
from shared.settings import OrgaSettings
from workers import key_handoff
from workers.key_handoff import MODEL_KEY_VARIABLES

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


class Role(StrEnum):
    """What a worker serves: ``all`` starts the workers of both other roles."""

    ALL = "all"
    REASONING = "reasoning"
    TOOLS = "tools"


@dataclass(frozen=True, slots=True)
class WorkerCommand:
    """One Celery worker process to start: its argv, its environment, and for a reasoning
    worker of a deployment with model keys, the socket that holds them (its number is in
    ``env`` as :data:`~workers.key_handoff.KEYS_FD_VARIABLE`)."""

    role: Role
    argv: list[str]
    env: dict[str, str]
    key_fd: int | None = None
    connection_fd: int | None = None
    """The socket holding its connection URLs (``ORGA_REDIS_URL``, ``ORGA_BROKER_URL``), its
    number in ``env`` as :data:`~workers.key_handoff.CONNECTION_FD_VARIABLE`."""

    @property
    def pass_fds(self) -> tuple[int, ...]:
        """The file descriptors the process inherits."""
        return tuple(fd for fd in (self.key_fd, self.connection_fd) if fd is not None)


def worker_command(
    role: Role,
    settings: OrgaSettings,
    environ: Mapping[str, str],
    extra: Sequence[str] = (),
    name: str | None = None,
    *,
    key_fd: int | None = None,
) -> WorkerCommand:
    """The command of one reasoning or tool worker; ``extra`` (Celery's own options) last,
    so that an operator's ``-c`` or ``-P`` wins. Its environment is ``environ`` without model
    keys, the serving side's secrets and the connection URLs (:func:`key_handoff.without_keys`);
    a reasoning worker gets the keys from the socket ``key_fd`` (:func:`key_handoff.send`), and
    every worker its connection URLs (``ORGA_REDIS_URL``, ``ORGA_BROKER_URL`` of ``environ``)
    from a socket of its own, made here (``connection_fd``)."""
    if role is Role.ALL:
        raise ValueError("worker_command takes one role; use worker_commands for 'all'")
    reasoning = role is Role.REASONING
    queue = keys.reasoning_queue if reasoning else keys.tools_queue
    default = settings.reasoning_concurrency if reasoning else settings.tool_concurrency
    concurrency = settings.worker_concurrency or default
    argv = [
        sys.executable, "-m", "orga.worker_main", "-Q", queue,
        "-P", "custom" if reasoning else settings.tool_pool, "-c", str(concurrency),
        "--loglevel", "INFO",
    ]  # fmt: skip
    if name is not None:
        argv += ["-n", name]
    env = key_handoff.without_keys(environ)
    connection_fd = _connection_fd(environ, env)
    if reasoning:
        env["CELERY_CUSTOM_WORKER_POOL"] = POOL_PATH
        if key_fd is not None:
            env[key_handoff.KEYS_FD_VARIABLE] = str(key_fd)
    elif key_fd is not None:
        raise ValueError("a tool worker never receives the model keys: key_fd is for reasoning")
    return WorkerCommand(
        role=role, argv=[*argv, *extra], env=env, key_fd=key_fd, connection_fd=connection_fd
    )


def _connection_fd(environ: Mapping[str, str], env: dict[str, str]) -> int | None:
    """A socket holding the connection URLs of ``environ`` for one worker, named in its
    ``env`` (None, and nothing named, when ``environ`` has none)."""
    urls = key_handoff.connection_urls(environ)
    if not urls:
        return None
    fd = key_handoff.send(urls)
    env[key_handoff.CONNECTION_FD_VARIABLE] = str(fd)
    return fd


def worker_commands(
    role: Role,
    settings: OrgaSettings,
    environ: Mapping[str, str],
    extra: Sequence[str] = (),
    name: str | None = None,
    *,
    prefix: str = "",
    key_fds: Sequence[int] | None = None,
) -> list[WorkerCommand]:
    """The workers ``role`` stands for: ``ORGA_REASONING_PROCESSES`` reasoning workers for
    ``reasoning``, one tool worker for ``tools``, both for ``all``; the reasoning workers first.

    One worker of one role is named ``name``. Otherwise (and when ``name`` is None) each is
    named ``<prefix><role>[<n>]-<pid>@%h``, ``<n>`` numbering the reasoning workers when there
    are several: node names must differ for Celery's remote control and for Flower (two
    unnamed workers of one host would both be Celery's ``celery@host``).

    No command's environment holds a model key. Each reasoning worker gets one socket of
    ``key_fds`` (one per reasoning worker: what a process that dropped the keys from its
    environment kept for them); None: sockets made now from the keys in ``environ``, if any.
    The sockets are closed by :func:`start`, or inherited through :func:`supervisor_exec`."""
    roles = (Role.REASONING, Role.TOOLS) if role is Role.ALL else (role,)
    counts = {Role.REASONING: settings.reasoning_processes, Role.TOOLS: 1}
    reasoning = counts[Role.REASONING] if Role.REASONING in roles else 0
    fds = _key_fds(environ, reasoning, key_fds)
    if role is not Role.ALL and counts[role] == 1:
        named = name if name is not None else f"{prefix}{role.value}-{os.getpid()}@%h"
        return [worker_command(role, settings, environ, extra, named, key_fd=next(iter(fds), None))]
    return [
        worker_command(
            each,
            settings,
            environ,
            extra,
            f"{prefix}{each.value}{n if counts[each] > 1 else ''}-{os.getpid()}@%h",
            key_fd=fds[n - 1] if each is Role.REASONING and fds else None,
        )
        for each in roles
        for n in range(1, counts[each] + 1)
    ]


def _key_fds(environ: Mapping[str, str], reasoning: int, given: Sequence[int] | None) -> list[int]:
    """One key socket per reasoning worker: ``given``, else new ones if ``environ`` has keys."""
    if given is None:
        found = key_handoff.model_keys(environ)
        return [key_handoff.send(found) for _ in range(reasoning)] if found else []
    if given and len(given) != reasoning:
        raise ValueError(
            f"{len(given)} model key sockets for {reasoning} reasoning workers: "
            f"{key_handoff.KEYS_FD_VARIABLE} is set by `orga` for the processes it starts; "
            "unset it"
        )
    return list(given)


def start(
    commands: Sequence[WorkerCommand], output: int | None = None
) -> list[subprocess.Popen[bytes]]:
    """Start ``commands`` in order; ``output`` (a file descriptor) receives their stdout and
    stderr. Each key socket is closed here once its worker started."""
    children = [supervisor.Child(c.argv, c.env, c.pass_fds) for c in commands]
    return supervisor.start(children, output)


def stop(
    processes: Sequence[subprocess.Popen[bytes]], timeout_s: float = supervisor.STOP_TIMEOUT_S
) -> None:
    """SIGTERM (Celery's warm shutdown) each process, SIGKILL those still alive after
    ``timeout_s``."""
    supervisor.stop(processes, timeout_s)


def supervisor_exec(
    commands: Sequence[WorkerCommand], environ: Mapping[str, str], *, fork: bool = False
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of :mod:`orga.supervisor` running ``commands``: what
    ``orga worker`` executes instead of itself when it starts more than one worker.
    ``environ`` is its own environment, from which each command's is derived; the supervisor
    runs without its model keys, holding only the reasoning workers' key sockets. With
    ``fork`` (``ORGA_WORKER_FORK``) and worker commands only, the supervisor forks the workers
    from itself once it imported their modules, so they share those pages
    (:func:`orga.supervisor.fork_workers`)."""
    children = [supervisor.Child(c.argv, c.env, c.pass_fds) for c in commands]
    base = key_handoff.without_keys(environ)
    env = {**base, supervisor.COMMANDS_VARIABLE: supervisor.encode(children, base)}
    env.pop(supervisor.FORK_VARIABLE, None)
    if fork and supervisor.forkable(children):
        env[supervisor.FORK_VARIABLE] = "1"
    return [sys.executable, "-m", "orga.supervisor"], env
