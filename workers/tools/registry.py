"""The tool registry: the built-in tools plus third-party tools from ``orga.tools`` entry points.

A distribution adds tools by declaring an entry point in the ``orga.tools`` group::

    [project.entry-points."orga.tools"]
    my_tools = "my_package.tools:make_tools"

The object it names may be a :class:`~workers.tools.base.Tool` instance, a Tool class
(instantiated without arguments), or a factory returning a Tool or a list of Tools. Each tool
is checked when it is loaded: a ``definition`` that is a ``ToolDefinition`` with a name
providers accept and a valid JSON Schema, and an ``async def run``. A broken entry point
becomes a :class:`~workers.tools.errors.ToolLoadError` naming it, returned beside the tools that
did load; it never prevents the others from loading. A tool whose name is already taken (by a
built-in or an earlier entry point) is refused the same way: the first one wins.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import httpx
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from shared.inference import ToolDefinition
from workers.tools.base import Tool
from workers.tools.command import CommandEnvironment, RunCommandTool
from workers.tools.delegate import DelegateTool
from workers.tools.errors import DuplicateToolError, ToolLoadError, UnknownToolError
from workers.tools.files import FileListTool, FileReadTool, FileWriteTool
from workers.tools.grep import GrepTool
from workers.tools.web import WebFetchTool

__all__ = [
    "ENTRY_POINT_GROUP",
    "TOOL_NAME_PATTERN",
    "EntryPointTools",
    "ToolRegistry",
    "builtin_tools",
    "default_registry",
    "load_entry_point_tools",
]

ENTRY_POINT_GROUP = "orga.tools"
TOOL_NAME_PATTERN = re.compile(r"\A[A-Za-z0-9_-]{1,64}\Z")
"""Tool names every provider accepts (OpenAI's function-name rule)."""

_log = logging.getLogger(__name__)


class ToolRegistry:
    """Tools by name, in registration order."""

    def __init__(
        self, tools: Iterable[Tool] = (), *, load_errors: Iterable[ToolLoadError] = ()
    ) -> None:
        self._tools: dict[str, Tool] = {}
        self.load_errors: tuple[ToolLoadError, ...] = tuple(load_errors)
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool, *, replace: bool = False) -> None:
        """Add ``tool``; raises DuplicateToolError when its name is taken and not ``replace``."""
        name = tool.definition.name
        if name in self._tools and not replace:
            raise DuplicateToolError(
                f"a tool named {name!r} is already registered; rename the new tool or "
                "register it with replace=True"
            )
        self._tools[name] = tool

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, or None (``Mapping.get`` semantics, as the executor uses)."""
        return self._tools.get(name)

    def require(self, name: str) -> Tool:
        """The tool called ``name``; raises UnknownToolError naming the known tools."""
        tool = self._tools.get(name)
        if tool is None:
            raise UnknownToolError(
                f"no tool named {name!r} is registered; known tools: {self.names()}"
            )
        return tool

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        """The tools (not their names), in registration order."""
        return iter(list(self._tools.values()))

    def names(self) -> list[str]:
        """The registered names, in registration order."""
        return list(self._tools)

    def definitions(self) -> list[ToolDefinition]:
        """The definitions the model sees, in registration order."""
        return [tool.definition for tool in self._tools.values()]


@dataclass(frozen=True, slots=True)
class EntryPointTools:
    """What loading an entry-point group produced: the tools, and one error per failure."""

    tools: tuple[Tool, ...]
    errors: tuple[ToolLoadError, ...]


def builtin_tools(
    *,
    command_environment: CommandEnvironment | None = None,
    web_transport: httpx.AsyncBaseTransport | None = None,
) -> list[Tool]:
    """``file_read``, ``file_write``, ``file_list``, ``grep``, ``run_command``, ``web_fetch``,
    and ``delegate`` (decided by the coordinator: :mod:`workers.tools.delegate`)."""
    return [
        FileReadTool(),
        FileWriteTool(),
        FileListTool(),
        GrepTool(),
        RunCommandTool(command_environment),
        WebFetchTool(transport=web_transport),
        DelegateTool(),
    ]


def load_entry_point_tools(
    group: str = ENTRY_POINT_GROUP, *, reserved_names: Iterable[str] = ()
) -> EntryPointTools:
    """Every tool the installed distributions declare in ``group``, and the failures.

    Entry points are loaded in name order. A tool whose name is in ``reserved_names`` or was
    produced by an earlier entry point is refused with a ToolLoadError.
    """
    taken = set(reserved_names)
    tools: list[Tool] = []
    errors: list[ToolLoadError] = []
    for entry_point in sorted(entry_points(group=group), key=lambda ep: (ep.name, ep.value)):
        try:
            loaded = _tools_of(entry_point, group)
        except ToolLoadError as exc:
            errors.append(exc)
            continue
        for tool in loaded:
            name = tool.definition.name
            if name in taken:
                errors.append(_clash(entry_point, group, name))
                continue
            taken.add(name)
            tools.append(tool)
    return EntryPointTools(tuple(tools), tuple(errors))


def default_registry(
    include_entry_points: bool = True, *, command_environment: CommandEnvironment | None = None
) -> ToolRegistry:
    """The built-in tools and, unless disabled, the ``orga.tools`` entry points.

    Entry points that fail are logged (``tools.entry_point_failed``) and kept in
    ``registry.load_errors``; the tools that loaded are registered.
    """
    builtins = builtin_tools(command_environment=command_environment)
    if not include_entry_points:
        return ToolRegistry(builtins)
    loaded = load_entry_point_tools(reserved_names=[t.definition.name for t in builtins])
    for error in loaded.errors:
        _log.warning("tools.entry_point_failed entry_point=%s error=%s", error.entry_point, error)
    return ToolRegistry([*builtins, *loaded.tools], load_errors=loaded.errors)


def _label(entry_point: EntryPoint, group: str) -> str:
    dist = entry_point.dist
    origin = f" from distribution {dist.name!r}" if dist is not None else ""
    return f"entry point {entry_point.name!r} ({entry_point.value}) in group {group!r}{origin}"


def _tools_of(entry_point: EntryPoint, group: str) -> list[Tool]:
    """Load ``entry_point`` and turn what it names into checked tools."""
    label = _label(entry_point, group)
    try:
        produced = _instantiate(entry_point.load())
    except Exception as exc:
        error = ToolLoadError(
            entry_point.name,
            f"{label} could not be loaded: {type(exc).__name__}: {exc}; "
            "fix the distribution or uninstall it",
        )
        raise error from exc
    candidates = list(produced) if isinstance(produced, list | tuple) else [produced]
    if not candidates:
        raise ToolLoadError(entry_point.name, f"{label} produced no tool")
    for candidate in candidates:
        problem = _tool_problem(candidate)
        if problem is not None:
            raise ToolLoadError(entry_point.name, f"{label} is not a valid tool: {problem}")
    return candidates


def _instantiate(obj: Any) -> Any:
    """A class is instantiated, a factory called, a tool instance kept as it is."""
    if isinstance(obj, type):
        return obj()
    if not isinstance(obj, Tool) and callable(obj):
        return obj()
    return obj


def _tool_problem(candidate: Any) -> str | None:
    """What makes ``candidate`` unusable as a tool, or None."""
    if not isinstance(candidate, Tool):
        return (
            f"got {type(candidate).__name__}, which has no 'definition' property and "
            "'run' method; return a Tool instance, a Tool class or a factory of Tools"
        )
    definition: object = candidate.definition
    if not isinstance(definition, ToolDefinition):
        return f"its definition is a {type(definition).__name__}, not a ToolDefinition"
    if not TOOL_NAME_PATTERN.match(definition.name):
        return f"tool name {definition.name!r} must be 1 to 64 letters, digits, '_' or '-'"
    if not inspect.iscoroutinefunction(candidate.run):
        return f"tool {definition.name!r}: run must be an 'async def' method"
    try:
        Draft202012Validator.check_schema(definition.parameters)
    except SchemaError as exc:
        return f"tool {definition.name!r} has an invalid JSON Schema: {exc.message}"
    return None


def _clash(entry_point: EntryPoint, group: str, name: str) -> ToolLoadError:
    return ToolLoadError(
        entry_point.name,
        f"{_label(entry_point, group)} provides tool {name!r}, whose name is already taken "
        "(by a built-in tool or an earlier entry point); rename the tool",
    )
