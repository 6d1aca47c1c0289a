"""Where a task's workspace is made, and why a sub-agent's stays inside its parent's.

A task's own workspace is a folder under ``ORGA_WORKSPACE_ROOT`` (or one its spec names), made
on first use (:func:`prepare_workspace`). A sub-agent delegated with ``delegated_workspace:
subfolder`` works in ``{parent workspace}/subagents/{child id}``: a folder inside a tree the
parent's own commands can change. A parent could put a symbolic link there before it delegates
(``ln -s /somewhere subagents/p.1``), and every later path check would then take the outside
folder for the child's workspace root. So a sub-agent's folder is made and checked here, on
every open, and never through a path the operating system resolves:

- every folder from the delegation tree root's workspace (``workspace_base``, a folder the
  runtime or the operator made) down to the child's is opened one component at a time with
  ``O_NOFOLLOW | O_DIRECTORY``: a link or anything but a directory on the way is refused
  (:class:`SubagentWorkspaceError`), and missing folders are created (``mkdir``, no link
  followed);
- the child's own folder must be one the runtime created: the first ``mkdir`` of it records
  its identity (device and inode) in :class:`WorkspaceClaims`, and each later open compares.
  A folder that was there before the runtime made it (a parent made it to plant files or
  links in it) or that was replaced since (renamed away, a new one put in its place) is
  refused.

A refusal is a configuration error of the sub-agent (its task fails at once, and the parent's
``delegate`` call gets that error as its result). The reasoning worker refuses the ``delegate``
call itself earlier, when it can already see a link in the way (:class:`SubagentsFolderGate`).

Limit: the check and the tool's own use of the path are two steps, so a process swapping the
checked folder for a link in between could redirect one call. The file tools open paths from
the workspace root without following links (:mod:`workers.tools.confined`), so what is left is
the root itself, checked again on the next call.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import hashlib
import os
import shutil
import uuid
from pathlib import Path
from typing import NoReturn, Protocol

from redis.asyncio import Redis

from shared import keys
from shared.actions import Deny, GateDecision, ProposedAction, ToolCallAction
from shared.delegation import is_delegate
from shared.errors import ConfigError
from workers.gates.base import GateContext, ReasoningPolicyGate

__all__ = [
    "SUBAGENTS_FOLDER",
    "InMemoryWorkspaceClaims",
    "RedisWorkspaceClaims",
    "SubagentWorkspaceError",
    "SubagentsFolderGate",
    "WorkspaceClaims",
    "open_subagent_workspace",
    "open_task_workspace",
    "prepare_workspace",
]

SUBAGENTS_FOLDER = "subagents"
"""The folder of a workspace that holds its sub-agents' workspaces (the runtime's own)."""

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class SubagentWorkspaceError(ConfigError):
    """A sub-agent's workspace folder is not a real directory the runtime made inside its
    parent's workspace; the message names the folder and what was found."""


class WorkspaceClaims(Protocol):
    """The identities of the sub-agent workspace folders the runtime created, by path."""

    async def claim(self, workspace: str, identity: str) -> str:
        """Record ``identity`` for ``workspace`` unless one is recorded; the recorded one."""
        ...

    async def recorded(self, workspace: str) -> str | None:
        """The identity recorded for ``workspace`` (None: the runtime never created it)."""
        ...


class InMemoryWorkspaceClaims:
    """Claims of one process (the in-process driver's)."""

    def __init__(self) -> None:
        self._claims: dict[str, str] = {}

    async def claim(self, workspace: str, identity: str) -> str:
        """Record ``identity`` unless one is recorded; the recorded one."""
        return self._claims.setdefault(workspace, identity)

    async def recorded(self, workspace: str) -> str | None:
        """The identity recorded for ``workspace``."""
        return self._claims.get(workspace)


class RedisWorkspaceClaims:
    """Claims shared by every worker, one key per folder (``keys.workspace_claim_key``), kept
    ``keys.workspace_claim_ttl_s`` after the folder was last opened."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    @staticmethod
    def _key(workspace: str) -> str:
        return keys.workspace_claim_key(hashlib.sha256(workspace.encode()).hexdigest())

    async def claim(self, workspace: str, identity: str) -> str:
        """``SET NX`` then read back: the first creator's identity wins."""
        key = self._key(workspace)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(key, identity, nx=True, ex=keys.workspace_claim_ttl_s)
            pipe.get(key)
            _, value = await pipe.execute()
        return _text(value) or identity

    async def recorded(self, workspace: str) -> str | None:
        """The recorded identity, its expiry renewed (``GETEX``)."""
        value = await self._redis.getex(self._key(workspace), ex=keys.workspace_claim_ttl_s)
        return _text(value)


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode()
    return value if isinstance(value, str) else None


async def open_task_workspace(workspace: Path, template: str | None) -> Path:
    """A task's own workspace, made when missing by :func:`prepare_workspace` in a thread, off
    the event loop: a template's copy (a repository: seconds to minutes) would otherwise stall
    every call and heartbeat that shares the loop (a thread-pool tool worker's). A workspace
    already there is returned at once, without a thread.

    Calls opening the same new workspace together (a turn's parallel tool calls) share one
    copy: the first starts it, the others await it (its error too); a caller cancelled does
    not cancel the copy the others wait for."""
    if workspace.exists():
        return workspace
    loop = asyncio.get_running_loop()
    opening = _opening.get(workspace)
    if opening is None or opening.get_loop() is not loop:
        opening = loop.create_task(asyncio.to_thread(prepare_workspace, workspace, template))
        _opening[workspace] = opening
        opening.add_done_callback(functools.partial(_opened, workspace))
    return await asyncio.shield(opening)


_opening: dict[Path, asyncio.Task[Path]] = {}
"""The workspaces being made by :func:`open_task_workspace`, each with the copy its callers
await; an entry leaves when its copy ends."""


def _opened(workspace: Path, opening: asyncio.Task[Path]) -> None:
    if _opening.get(workspace) is opening:
        del _opening[workspace]
    if not opening.cancelled():
        opening.exception()  # retrieved: every caller may have been cancelled meanwhile


def prepare_workspace(workspace: Path, template: str | None) -> Path:
    """Create a task's own workspace; a template folder is copied in once, atomically.

    A template that is not a folder is a configuration error (the task names it).
    """
    if workspace.exists():
        return workspace
    _check_template(template)
    workspace.parent.mkdir(parents=True, exist_ok=True)
    if template is None:
        workspace.mkdir(exist_ok=True)
        return workspace
    staging = workspace.parent / f".{workspace.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    shutil.copytree(template, staging, symlinks=True)
    try:
        staging.rename(workspace)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not workspace.exists():
            raise
    return workspace


def _check_template(template: str | None) -> None:
    if template is not None and not Path(template).is_dir():
        raise ConfigError(
            f"workspace_template {template!r} is not a folder on this worker; give the path of "
            "an existing folder (absolute, or relative to the task file) or remove it"
        )


async def open_subagent_workspace(
    workspace: Path,
    base: Path,
    claims: WorkspaceClaims,
    template: str | None = None,
    *,
    create: bool = True,
) -> tuple[Path, tuple[int, int]]:
    """The sub-agent workspace ``workspace`` below ``base``, made (``create``) or checked as
    the module says, and the ``(device, inode)`` of the folder checked (the tools compare the
    folder they open with it: :func:`workers.tools.workspace.expecting_workspace`); raises
    :class:`SubagentWorkspaceError`.

    ``create=False`` (a reasoning worker, whose mount may be read-only) only checks: a missing
    folder is then a :class:`FileNotFoundError`. With a ``template`` to copy, the walk runs in
    a thread, off the event loop (the copy may take minutes, as :func:`open_task_workspace`'s).
    """
    parts = _components(workspace, base)
    if create:
        base.mkdir(parents=True, exist_ok=True)
        _check_template(template)
    copied = template if create else None
    walk = functools.partial(_walk, base, parts, workspace, copied, create=create)
    created, status = walk() if copied is None else await asyncio.to_thread(walk)
    key, inode = str(workspace), str(status.st_ino)
    recorded = await claims.claim(key, inode) if created else await _recorded(claims, key)
    if recorded is None:
        raise SubagentWorkspaceError(
            f"sub-agent workspace {key!r} was not created by the runtime: the folder was "
            "already there when the sub-agent first used it (something else, such as a "
            "command of the parent task, made it); the runtime only runs a sub-agent in a "
            f"folder it made itself. Remove that folder and delegate again, and leave "
            f"{SUBAGENTS_FOLDER}/ to the runtime"
        )
    if recorded != inode:
        raise SubagentWorkspaceError(
            f"sub-agent workspace {key!r} is not the folder the runtime created for it (it "
            "was replaced since); the sub-agent is stopped rather than run in a folder "
            f"someone else made. Leave {SUBAGENTS_FOLDER}/ to the runtime"
        )
    return workspace, (status.st_dev, status.st_ino)


_CLAIM_LOOKS = 20
_CLAIM_LOOK_S = 0.05


async def _recorded(claims: WorkspaceClaims, key: str) -> str | None:
    """The recorded claim, looked at again for up to a second when there is none: another
    call of the same sub-agent may have made the folder and not recorded it yet."""
    for _ in range(_CLAIM_LOOKS):
        recorded = await claims.recorded(key)
        if recorded is not None:
            return recorded
        await asyncio.sleep(_CLAIM_LOOK_S)
    return await claims.recorded(key)


def _components(workspace: Path, base: Path) -> list[str]:
    """The folder names from ``base`` down to ``workspace``: a sub-agent's path is
    ``{base}[/{id}]/subagents/{id}[/subagents/{id}...]`` (a copy's own folder is ``{id}``
    directly below the workspace root), spelled without ``..`` or links."""
    relative = os.path.relpath(os.path.normpath(workspace), os.path.normpath(base))
    parts = relative.split(os.sep)
    pairs = parts[len(parts) % 2 :]
    if (
        relative.startswith("..")
        or os.path.isabs(relative)
        or relative == "."
        or any(p != SUBAGENTS_FOLDER for p in pairs[::2])
        or any(p in ("", ".", "..", SUBAGENTS_FOLDER) for p in pairs[1::2])
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise SubagentWorkspaceError(
            f"sub-agent workspace {str(workspace)!r} is not a {SUBAGENTS_FOLDER}/<id> folder "
            f"below its delegation root's workspace {str(base)!r}; a sub-agent works only in "
            "a folder the runtime makes there"
        )
    return parts


def _walk(
    base: Path, parts: list[str], workspace: Path, template: str | None, *, create: bool
) -> tuple[bool, os.stat_result]:
    """Open ``base`` then each of ``parts`` without following a link (creating missing ones
    when ``create``, the last from ``template`` when given): whether the last was made now,
    and its status."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    created = False
    try:
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            created = False
            try:
                child = os.open(part, _DIRECTORY, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                created = _make(fd, part, template if last else None, base, parts[:index])
                child = _open_checked(fd, part, parts[: index + 1], base, workspace)
            except OSError as exc:
                _refuse(exc, parts[: index + 1], base, workspace)
            os.close(fd)
            fd = child
        status = os.fstat(fd)
    finally:
        os.close(fd)
    return created, status


def _make(fd: int, name: str, template: str | None, base: Path, above: list[str]) -> bool:
    """Make folder ``name`` in ``fd`` (a copy of ``template``, staged beside it and renamed
    into place); False when another call made it first."""
    if template is None:
        try:
            os.mkdir(name, dir_fd=fd)
        except FileExistsError:
            return False
        return True
    staging = f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    os.mkdir(staging, dir_fd=fd)
    shutil.copytree(
        template, os.path.join(base, *above, staging), symlinks=True, dirs_exist_ok=True
    )
    try:
        os.rename(staging, name, src_dir_fd=fd, dst_dir_fd=fd)
    except OSError:
        shutil.rmtree(os.path.join(base, *above, staging), ignore_errors=True)
        return False  # something is there: opened (and checked) by the caller
    return True


def _open_checked(fd: int, part: str, path: list[str], base: Path, workspace: Path) -> int:
    try:
        return os.open(part, _DIRECTORY, dir_fd=fd)
    except OSError as exc:
        _refuse(exc, path, base, workspace)


def _refuse(exc: OSError, path: list[str], base: Path, workspace: Path) -> NoReturn:
    where = os.path.join(base, *path)
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK, errno.EACCES, errno.EPERM):
        found = (
            "a symbolic link"
            if os.path.islink(where)
            else "not a directory"
            if exc.errno not in (errno.EACCES, errno.EPERM)
            else "a directory the worker may not open"
        )
        raise SubagentWorkspaceError(
            f"sub-agent workspace {str(workspace)!r} refused: {where!r} is {found}; a "
            "sub-agent's folder and every folder above it inside the parent's workspace must "
            f"be real directories the runtime made. Remove {where!r} (and leave "
            f"{SUBAGENTS_FOLDER}/ to the runtime), then delegate again"
        ) from exc
    raise exc


class SubagentsFolderGate:
    """Wraps a task's gate: denies a ``delegate`` call when the parent's ``subagents`` folder,
    or a folder named after one of its children in it, is a link or not a directory, before a
    child is created (the child's worker checks again, every time it opens its folder)."""

    def __init__(self, inner: ReasoningPolicyGate) -> None:
        self._inner = inner

    async def evaluate_action(self, action: ProposedAction, context: GateContext) -> GateDecision:
        """Deny a ``delegate`` call whose sub-agent folder would not be a real directory."""
        if (
            isinstance(action, ToolCallAction)
            and is_delegate(action.name)
            and context.workspace is not None
        ):
            problem = subagents_folder_problem(context.workspace, context.task_id)
            if problem is not None:
                return Deny(reason=f"delegation refused: {problem}")
        return await self._inner.evaluate_action(action, context)


def subagents_folder_problem(workspace: Path, task_id: str | None) -> str | None:
    """What is wrong with ``workspace/subagents`` for a new sub-agent (None: nothing seen)."""
    folder = workspace / SUBAGENTS_FOLDER
    if not os.path.lexists(folder):
        return None
    if folder.is_symlink() or not folder.is_dir():
        kind = "a symbolic link" if folder.is_symlink() else "not a directory"
        return (
            f"{SUBAGENTS_FOLDER!r} in this task's workspace is {kind}; it holds the sub-agents' "
            f"workspaces and must be a real directory the runtime makes: remove it "
            f"(rm {SUBAGENTS_FOLDER}) and delegate again"
        )
    if task_id is None:
        return None
    prefix = f"{task_id}."
    with os.scandir(folder) as entries:
        bad = [
            e for e in entries if e.name.startswith(prefix) and (e.is_symlink() or not e.is_dir())
        ]
    if not bad:
        return None
    entry = min(bad, key=lambda e: e.name)
    kind = "a symbolic link" if entry.is_symlink() else "not a directory"
    return (
        f"{SUBAGENTS_FOLDER}/{entry.name} in this task's workspace is {kind}, where the "
        f"runtime makes a sub-agent's workspace: remove it (rm {SUBAGENTS_FOLDER}/{entry.name}) "
        "and delegate again"
    )
