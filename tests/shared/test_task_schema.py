"""`orga schema`: every default the task file's JSON Schema prints loads back in a task file
(a duration's default is written as task files write it, "5m", not ISO 8601's "PT5M")."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from orga.cli import app
from shared.task_spec import load_task_file

Wrap = Callable[[dict[str, Any]], dict[str, Any]]
Hold = Callable[[Any], Any]

ACROSS_FIELDS: dict[str, dict[str, Any]] = {
    "CriticSpec": {"human": True},
    "McpServerSpec": {"command": ["python3", "server.py"]},
}
"""What a rule across fields needs beyond the defaults (a critic names its reviewer, an MCP
server its command or URL)."""


def _printed_schema() -> dict[str, Any]:
    """What `orga schema` prints."""
    done = CliRunner().invoke(app, ["schema"])
    assert done.exit_code == 0, done.output
    return dict(json.loads(done.output))


class _Walk:
    """Every object of the schema that has defaults, with a task file holding it."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        self.defs: dict[str, Any] = schema.get("$defs", {})

    def resolve(self, node: dict[str, Any]) -> dict[str, Any]:
        ref = node.get("$ref")
        return dict(self.defs[ref.rsplit("/", 1)[-1]]) if ref else node

    def branches(self, node: dict[str, Any]) -> Iterator[tuple[dict[str, Any], Hold]]:
        """The object schemas a property can hold, with how the property holds one."""
        node = self.resolve(node)
        for key in ("anyOf", "oneOf"):
            for branch in node.get(key, []):
                yield from self.branches(branch)
        if node.get("type") == "array" and isinstance(node.get("items"), dict):
            for item, wrap in self.branches(node["items"]):
                yield item, lambda obj, wrap=wrap: [wrap(obj)]
        if isinstance(node.get("additionalProperties"), dict):
            for item, wrap in self.branches(node["additionalProperties"]):
                yield item, lambda obj, wrap=wrap: {"key": wrap(obj)}
        if "properties" in node:
            yield node, lambda obj: obj

    def minimal(self, node: dict[str, Any]) -> dict[str, Any]:
        """An instance with only the required properties (and a union member's tag)."""
        props = node.get("properties", {})
        return {
            name: self.value(prop) for name, prop in props.items()
            if name in node.get("required", []) or "const" in prop
        }  # fmt: skip

    def value(self, prop: dict[str, Any]) -> Any:
        prop = self.resolve(prop)
        if "const" in prop:
            return prop["const"]
        if "enum" in prop:
            return prop["enum"][0]
        if "properties" in prop:
            return self.minimal(prop)
        for branch in prop.get("anyOf", []):
            if branch.get("type") != "null":
                return self.value(branch)
        kind = prop.get("type")
        return {"string": "x", "integer": 1, "number": 1, "boolean": False, "array": []}[kind]

    def objects(self) -> Iterator[tuple[str, dict[str, Any], Wrap]]:
        """(title, object schema, how a task file holds an instance of it), each object once."""
        seen: set[str] = set()
        queue: list[tuple[dict[str, Any], Wrap]] = [(self.schema, lambda obj: obj)]
        while queue:
            node, hold = queue.pop(0)
            title = node.get("title", "?")
            if title in seen:
                continue
            seen.add(title)
            yield title, node, hold
            base = self.minimal(node)
            for name, prop in node.get("properties", {}).items():
                for child, wrap in self.branches(prop):
                    queue.append((child, lambda obj, hold=hold, base=base, name=name, wrap=wrap:
                                  hold({**base, name: wrap(obj)})))  # fmt: skip


def _with_defaults() -> list[tuple[str, dict[str, Any]]]:
    walk = _Walk(_printed_schema())
    cases = []
    for title, node, hold in walk.objects():
        props = node.get("properties", {})
        defaults = {name: prop["default"] for name, prop in props.items() if "default" in prop}
        if defaults:
            task = hold({**walk.minimal(node), **defaults, **ACROSS_FIELDS.get(title, {})})
            cases.append((title, {**task, "goal": "g"}))
    return cases


def test_orga_schema_prints_the_task_spec_schema() -> None:
    """`orga schema` prints task_json_schema(), durations' defaults in the project's format."""
    from shared.task_spec import task_json_schema

    printed = _printed_schema()
    assert printed == task_json_schema()
    with_defaults = {
        title for title, node in [*printed["$defs"].items(), ("TaskSpec", printed)]
        if any("default" in prop for prop in node.get("properties", {}).values())
    }  # fmt: skip
    assert {title for title, _task in _with_defaults()} == with_defaults  # every one is loaded
    limits = printed["$defs"]["TaskLimits"]["properties"]
    assert (limits["step_timeout"]["default"], limits["tool_timeout"]["default"]) == ("5m", "30s")


@pytest.mark.parametrize(
    ("title", "task"), _with_defaults(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_default_the_schema_prints_loads_back(
    title: str, task: dict[str, Any], tmp_path: Path
) -> None:
    """A task file setting an object's every property to the default `orga schema` prints for
    it is accepted by the task loader."""
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(task))
    load_task_file(path)
