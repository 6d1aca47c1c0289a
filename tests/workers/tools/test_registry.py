"""The registry, the built-in tools' schemas, and loading tools from ``orga.tools`` entry points."""

from __future__ import annotations

import logging
from importlib.metadata import EntryPoint
from typing import Any

import pytest
from jsonschema import Draft202012Validator

import workers.tools.registry as registry_module
from shared.inference import ToolDefinition
from workers.tools import (
    DuplicateToolError,
    Tool,
    ToolContext,
    ToolOutput,
    ToolRegistry,
    UnknownToolError,
    builtin_tools,
    default_registry,
    load_entry_point_tools,
)

BUILTIN_NAMES = [
    "file_read", "file_write", "file_list", "grep", "run_command", "web_fetch", "delegate"
]  # fmt: skip


class EchoTool:
    """A minimal third-party tool."""

    def __init__(self, name: str = "echo") -> None:
        self._definition = ToolDefinition(
            name=name,
            description="Echo the text.",
            parameters={"type": "object", "properties": {"text": {"type": "string"}}},
        )

    @property
    def definition(self) -> ToolDefinition:
        """The echo definition."""
        return self._definition

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolOutput:
        """Echo the text back."""
        return ToolOutput(content=str(arguments.get("text", "")))


class SyncRunTool(EchoTool):
    """A tool whose run is not async."""

    def __init__(self) -> None:
        super().__init__("sync_tool")

    def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolOutput:  # type: ignore[override]
        """Not a coroutine."""
        return ToolOutput(content="")


ECHO_INSTANCE = EchoTool("echo_instance")
BAD_NAME_TOOL = EchoTool("has space")
CLASHING_TOOL = EchoTool("grep")
NOT_A_TOOL = object()


class BadSchemaTool(EchoTool):
    """A tool whose JSON Schema is invalid."""

    def __init__(self) -> None:
        super().__init__("bad_schema")
        self._definition = ToolDefinition(name="bad_schema", parameters={"type": "objekt"})


def make_pair() -> list[Tool]:
    """A factory returning two tools."""
    return [EchoTool("pair_one"), EchoTool("pair_two")]


def make_single() -> Tool:
    """A factory returning one tool, whose name an earlier entry point already took."""
    return EchoTool("pair_one")


def make_nothing() -> list[Tool]:
    """A factory returning no tool."""
    return []


def exploding_factory() -> Tool:
    """A factory that fails."""
    raise RuntimeError("database unreachable")


def _entry(name: str, attribute: str) -> EntryPoint:
    return EntryPoint(name=name, value=f"{__name__}:{attribute}", group="orga.tools")


ENTRY_POINTS = [
    _entry("a_class", "EchoTool"),
    _entry("b_instance", "ECHO_INSTANCE"),
    _entry("c_factory", "make_pair"),
    _entry("d_duplicate", "make_single"),
    EntryPoint(name="e_missing_module", value="no_such_module.tools:Tool", group="orga.tools"),
    _entry("f_missing_attr", "DoesNotExist"),
    _entry("g_exploding", "exploding_factory"),
    _entry("h_not_a_tool", "NOT_A_TOOL"),
    _entry("i_bad_name", "BAD_NAME_TOOL"),
    _entry("j_sync_run", "SyncRunTool"),
    _entry("k_bad_schema", "BadSchemaTool"),
    _entry("l_clash", "CLASHING_TOOL"),
    _entry("m_empty", "make_nothing"),
]


@pytest.fixture
def fake_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the registry see ENTRY_POINTS in the orga.tools group."""

    def entry_points(*, group: str) -> list[EntryPoint]:
        return ENTRY_POINTS if group == "orga.tools" else []

    monkeypatch.setattr(registry_module, "entry_points", entry_points)


def test_builtin_tools_and_their_order() -> None:
    """The seven built-in tools (delegate among them) are registered in a stable order."""
    registry = ToolRegistry(builtin_tools())
    assert registry.names() == BUILTIN_NAMES
    assert [d.name for d in registry.definitions()] == BUILTIN_NAMES
    assert len(registry) == 7
    assert "grep" in registry
    assert registry.require("grep").definition.name == "grep"
    assert [tool.definition.name for tool in registry] == BUILTIN_NAMES


def test_duplicate_and_unknown_names() -> None:
    """A taken name is refused unless replaced; get gives None, require lists the known names."""
    registry = ToolRegistry([EchoTool()])
    with pytest.raises(DuplicateToolError, match="'echo' is already registered"):
        registry.register(EchoTool())
    replacement = EchoTool()
    registry.register(replacement, replace=True)
    assert registry.get("echo") is replacement
    assert registry.get("nope") is None
    with pytest.raises(UnknownToolError, match=r"no tool named 'nope'.*\['echo'\]"):
        registry.require("nope")
    with pytest.raises(KeyError):
        registry.require("nope")


GOOD_AND_BAD_ARGUMENTS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
    "file_read": (
        [
            {"path": "a.txt"},
            {"path": "a", "start_line": 1, "end_line": 9},
            {"path": "a", "limit": 2},
        ],
        [{}, {"path": ""}, {"path": "a", "start_line": 0}, {"path": "a", "x": 1}, {"path": 3}],
    ),
    "file_write": (
        [{"path": "a", "content": ""}, {"path": "a", "content": "x", "create_dirs": False}],
        [
            {"path": "a"},
            {"content": "x"},
            {"path": "a", "content": 1},
            {"path": "a", "content": "", "mode": 1},
        ],
    ),
    "file_list": (
        [{}, {"path": "src", "recursive": True, "max_entries": 10}],
        [{"max_entries": 0}, {"max_entries": 10_001}, {"recursive": "yes"}, {"depth": 2}],
    ),
    "grep": (
        [
            {"pattern": "x"},
            {"pattern": "x", "path": "s", "glob": "*.py", "max_matches": 5, "ignore_case": True},
        ],
        [{}, {"pattern": ""}, {"pattern": "x", "max_matches": 0}, {"pattern": "x", "regex": True}],
    ),
    "run_command": (
        [{"command": "ls"}, {"command": "ls", "timeout_s": 0.5}],
        [{}, {"command": ""}, {"command": "ls", "timeout_s": 0}, {"command": "ls", "env": {}}],
    ),
    "web_fetch": (
        [{"url": "https://example.com"}, {"url": "https://example.com", "max_bytes": 100}],
        [{}, {"url": ""}, {"url": "https://e.com", "max_bytes": 0}, {"url": "u", "method": "POST"}],
    ),
    "delegate": (
        [
            {"agent": "alpha", "goal": "say 1"},
            {
                "agent": "alpha",
                "goal": "g",
                "steps": [{"id": "a", "instruction": "do"}],
                "budget": {"iterations": 3, "tokens": 1000},
            },
        ],
        [
            {"goal": "g"},
            {"agent": "alpha", "goal": ""},
            {"agent": "bad name", "goal": "g"},
            {"agent": "a", "goal": "g", "budget": {"iterations": 0}},
            {"agent": "a", "goal": "g", "steps": [{"id": "a"}]},
        ],
    ),
}


@pytest.mark.parametrize("tool", builtin_tools(), ids=lambda tool: tool.definition.name)
def test_builtin_schemas_accept_good_and_reject_bad_arguments(tool: Tool) -> None:
    """Each schema is valid, closed, described, and separates good from bad arguments."""
    definition = tool.definition
    schema = definition.parameters
    Draft202012Validator.check_schema(schema)
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert definition.description
    assert all(prop.get("description") for prop in schema["properties"].values())
    validator = Draft202012Validator(schema)
    good, bad = GOOD_AND_BAD_ARGUMENTS[definition.name]
    for arguments in good:
        assert validator.is_valid(arguments), arguments
    for arguments in bad:
        assert not validator.is_valid(arguments), arguments


def test_entry_points_load_and_failures_are_reported(fake_entry_points: None) -> None:
    """Good entry points load; each broken one is an error naming it; none stops the others."""
    loaded = load_entry_point_tools(reserved_names=BUILTIN_NAMES)
    assert [tool.definition.name for tool in loaded.tools] == [
        "echo",
        "echo_instance",
        "pair_one",
        "pair_two",
    ]
    errors = {error.entry_point: str(error) for error in loaded.errors}
    assert sorted(errors) == [
        "d_duplicate",
        "e_missing_module",
        "f_missing_attr",
        "g_exploding",
        "h_not_a_tool",
        "i_bad_name",
        "j_sync_run",
        "k_bad_schema",
        "l_clash",
        "m_empty",
    ]
    assert (
        "'e_missing_module' (no_such_module.tools:Tool) in group 'orga.tools'"
        in errors["e_missing_module"]
    )
    assert "ModuleNotFoundError" in errors["e_missing_module"]
    assert "RuntimeError: database unreachable" in errors["g_exploding"]
    assert "got object" in errors["h_not_a_tool"]
    assert "'has space' must be 1 to 64" in errors["i_bad_name"]
    assert "'async def'" in errors["j_sync_run"]
    assert "invalid JSON Schema" in errors["k_bad_schema"]
    assert "'grep', whose name is already taken" in errors["l_clash"]
    assert "'pair_one', whose name is already taken" in errors["d_duplicate"]
    assert "produced no tool" in errors["m_empty"]


def test_default_registry_adds_entry_point_tools(
    fake_entry_points: None, caplog: pytest.LogCaptureFixture
) -> None:
    """The default registry holds the built-ins, then the plugins; failures are logged and kept."""
    with caplog.at_level(logging.WARNING, logger=registry_module.__name__):
        registry = default_registry()
    assert registry.names() == [*BUILTIN_NAMES, "echo", "echo_instance", "pair_one", "pair_two"]
    assert registry.require("grep") is not CLASHING_TOOL
    assert len(registry.load_errors) == 10
    assert sum("tools.entry_point_failed" in r.getMessage() for r in caplog.records) == 10


def test_default_registry_without_entry_points(fake_entry_points: None) -> None:
    """Entry points can be left out."""
    registry = default_registry(include_entry_points=False)
    assert registry.names() == BUILTIN_NAMES
    assert registry.load_errors == ()


def test_other_group_is_empty(fake_entry_points: None) -> None:
    """A group without entry points loads nothing."""
    loaded = load_entry_point_tools("other.group")
    assert loaded.tools == ()
    assert loaded.errors == ()
