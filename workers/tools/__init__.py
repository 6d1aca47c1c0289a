"""Tools the agent can call, and their registry (built-ins plus the ``orga.tools`` entry points).

Built-in tools: ``file_read``, ``file_write``, ``file_list`` and ``grep`` (confined to the
workspace), ``run_command`` (a shell in the workspace with a scrubbed environment) and
``web_fetch`` (public http(s) only). Every tool fills ``ToolOutput.metadata`` with what the
stagnation detector needs; see each module's docstring.
"""

from workers.tools.base import Tool, ToolContext, ToolOutput
from workers.tools.command import (
    DEFAULT_PATH,
    RUN_COMMAND_DEFINITION,
    TIMEOUT_EXIT_CODE,
    CommandEnvironment,
    RunCommandTool,
)
from workers.tools.errors import (
    BinaryContentError,
    BlockedUrlError,
    DuplicateToolError,
    PathOutsideWorkspaceError,
    ToolError,
    ToolLoadError,
    UnknownToolError,
    WorkspacePathError,
)
from workers.tools.files import (
    FILE_LIST_DEFINITION,
    FILE_READ_DEFINITION,
    FILE_WRITE_DEFINITION,
    FileListTool,
    FileReadTool,
    FileWriteTool,
)
from workers.tools.grep import GREP_DEFINITION, GrepTool
from workers.tools.registry import (
    ENTRY_POINT_GROUP,
    EntryPointTools,
    ToolRegistry,
    builtin_tools,
    default_registry,
    load_entry_point_tools,
)
from workers.tools.web import (
    WEB_FETCH_DEFINITION,
    Resolver,
    SystemResolver,
    WebFetchTool,
    blocked_address_reason,
)
from workers.tools.workspace import display_path, resolve_in_workspace, workspace_root

__all__ = [
    "DEFAULT_PATH",
    "ENTRY_POINT_GROUP",
    "FILE_LIST_DEFINITION",
    "FILE_READ_DEFINITION",
    "FILE_WRITE_DEFINITION",
    "GREP_DEFINITION",
    "RUN_COMMAND_DEFINITION",
    "TIMEOUT_EXIT_CODE",
    "WEB_FETCH_DEFINITION",
    "BinaryContentError",
    "BlockedUrlError",
    "CommandEnvironment",
    "DuplicateToolError",
    "EntryPointTools",
    "FileListTool",
    "FileReadTool",
    "FileWriteTool",
    "GrepTool",
    "PathOutsideWorkspaceError",
    "Resolver",
    "RunCommandTool",
    "SystemResolver",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolLoadError",
    "ToolOutput",
    "ToolRegistry",
    "UnknownToolError",
    "WebFetchTool",
    "WorkspacePathError",
    "blocked_address_reason",
    "builtin_tools",
    "default_registry",
    "display_path",
    "load_entry_point_tools",
    "resolve_in_workspace",
    "workspace_root",
]
