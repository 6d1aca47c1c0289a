"""The tool seam: a definition the model sees and an async ``run``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from shared.inference import ToolDefinition
from shared.mcp import McpTarget

__all__ = ["Tool", "ToolContext", "ToolOutput", "reads_only"]


class ToolContext(BaseModel):
    """Where and under which limits a tool runs."""

    model_config = ConfigDict(frozen=True)

    workspace: Path
    timeout_s: float = 30.0
    max_output_bytes: int = 64_000
    allow_private_network: bool = False
    agent_id: str = ""
    task_id: str | None = None
    idempotency_key: str | None = None
    """The same for every delivery of this call, re-dispatches included (its fence without the
    attempt and nonce, with the tool and a digest of its arguments); None outside a task."""
    mcp: McpTarget | None = None
    """For a call of an MCP tool (``<server>__<tool>``): the server and tool it goes to."""
    checked_schema: Any = Field(default=None, repr=False, exclude=True)
    """The ``parameters`` object of the tool definition these very arguments already passed
    in this process under Draft 2020-12 (the gate's schema pre-check of a call run inline;
    set only when the gate's check and the tool's are the same validation,
    ``workers.handlers.checked_schemas``): a tool whose own schema is that object need not
    check them again. None: not checked here."""


class ToolOutput(BaseModel):
    """What a tool returns.

    ``metadata`` carries what the stagnation detector needs, as strings: ``kind`` (``read``,
    ``write``, ``command``, ``other``), ``path``, ``content_hash`` (reads), ``before_hash`` and
    ``after_hash`` (writes), ``exit_code`` (commands), ``output_hash``.
    """

    model_config = ConfigDict(frozen=True)

    content: str
    is_error: bool = False
    metadata: dict[str, str] = Field(default_factory=dict)


@runtime_checkable
class Tool(Protocol):
    """A tool the agent can call."""

    @property
    def definition(self) -> ToolDefinition:
        """Name, description and JSON Schema of the arguments."""
        ...

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolOutput:
        """Run with validated arguments; expected failures come back as ``is_error`` outputs."""
        ...


def starts_processes(tool: Tool | None) -> bool:
    """Whether ``tool`` declares ``starts_processes = True`` (``run_command``): a reasoning
    worker, which holds the model key, never runs it, even for ``tool_dispatch: inline``, so
    that it is never the ancestor of an agent's command (:mod:`workers.key_handoff`)."""
    return getattr(tool, "starts_processes", False) is True


def reads_only(tool: Tool | None) -> bool:
    """Whether ``tool`` declares ``read_only = True``: it reads (the workspace, the knowledge
    store) in bounded time, runs no code and writes nothing, so a reasoning worker may run it
    next to the model key, on a read-only mount of the workspaces (``tool_dispatch: auto``).
    A tool that does not say so is not."""
    return getattr(tool, "read_only", False) is True
