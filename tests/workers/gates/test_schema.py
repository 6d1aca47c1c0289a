"""The schema pre-check: Symbiont's exact reasons (§1.5), the blank-arguments improvement."""

from __future__ import annotations

from typing import Any

import pytest

from shared.actions import ToolCallAction
from shared.inference import ToolDefinition
from workers.gates.schema import denial_message, schema_failure_message, validate_tool_arguments

READ_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "start_line": {"type": "integer", "minimum": 1},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["path"],
    "additionalProperties": False,
}
DEFINITIONS = [
    ToolDefinition(name="file_read", parameters=READ_SCHEMA),
    ToolDefinition(name="now", parameters={"type": "object", "properties": {}}),
]


def call(name: str, arguments: str) -> ToolCallAction:
    """A tool call with the given raw argument text."""
    return ToolCallAction(call_id="c1", name=name, arguments=arguments)


def test_valid_arguments_pass() -> None:
    """Arguments that satisfy the declared schema give no reason."""
    assert validate_tool_arguments(call("file_read", '{"path": "a.py"}'), DEFINITIONS) is None


def test_invalid_json_reason() -> None:
    """Unparsable text names the tool and the decoder's error."""
    reason = validate_tool_arguments(call("file_read", '{"path": '), DEFINITIONS)
    assert reason == (
        "tool 'file_read' arguments are not valid JSON: Expecting value: line 1 column 10 (char 9)"
    )


def test_nan_is_not_json() -> None:
    """NaN is refused as serde refuses it, not passed on as a float."""
    reason = validate_tool_arguments(call("file_read", '{"path": NaN}'), DEFINITIONS)
    assert reason == "tool 'file_read' arguments are not valid JSON: NaN is not a JSON number"


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("null", "null"),
        ("true", "boolean"),
        ("3", "number"),
        ("2.5", "number"),
        ('"a.py"', "string"),
        ('["a.py"]', "array"),
    ],
)
def test_non_object_reason(text: str, kind: str) -> None:
    """A JSON value that is not an object is named by its JSON type."""
    reason = validate_tool_arguments(call("file_read", text), DEFINITIONS)
    assert reason == f"tool 'file_read' arguments must be a JSON object, got {kind}"


def test_non_object_checked_for_undeclared_tools() -> None:
    """A tool outside the definitions still gets the object check."""
    reason = validate_tool_arguments(call("mystery", "[1]"), DEFINITIONS)
    assert reason == "tool 'mystery' arguments must be a JSON object, got array"


def test_undeclared_tool_object_passes() -> None:
    """A tool outside the definitions is not schema-checked (the gate still decides)."""
    assert validate_tool_arguments(call("mystery", '{"x": 1}'), DEFINITIONS) is None


def test_root_error_has_no_path_prefix() -> None:
    """An error about the object itself is reported without an ``at`` prefix."""
    reason = validate_tool_arguments(call("file_read", "{}"), DEFINITIONS)
    assert reason == (
        "tool 'file_read' arguments failed schema validation: 'path' is a required property"
    )


def test_all_errors_joined_with_paths() -> None:
    """Every error is reported, joined with '; ', nested ones prefixed with a JSON pointer."""
    arguments = '{"path": 3, "start_line": 0, "tags": ["a", 7]}'
    reason = validate_tool_arguments(call("file_read", arguments), DEFINITIONS)
    assert reason == (
        "tool 'file_read' arguments failed schema validation: "
        "at '/path': 3 is not of type 'string'; "
        "at '/start_line': 0 is less than the minimum of 1; "
        "at '/tags/1': 7 is not of type 'string'"
    )


def test_additional_property_reported() -> None:
    """An unexpected property is reported at the root."""
    reason = validate_tool_arguments(call("file_read", '{"path": "a", "x": 1}'), DEFINITIONS)
    assert reason == (
        "tool 'file_read' arguments failed schema validation: "
        "Additional properties are not allowed ('x' was unexpected)"
    )


def test_invalid_schema_fails_closed() -> None:
    """A declared schema that is itself invalid refuses the call, naming the schema error."""
    broken = [ToolDefinition(name="t", parameters={"type": "objekt"})]
    reason = validate_tool_arguments(call("t", "{}"), broken)
    assert reason is not None
    assert reason.startswith(
        "tool 't' has an invalid declared schema (refusing to dispatch): at '/type': "
    )


def test_unresolvable_ref_fails_closed() -> None:
    """A schema whose $ref cannot be resolved refuses the call instead of raising."""
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    reason = validate_tool_arguments(
        call("t", '{"a": 1}'), [ToolDefinition(name="t", parameters=schema)]
    )
    assert reason is not None
    assert reason.startswith("tool 't' has an invalid declared schema (refusing to dispatch): ")
    assert "unresolvable reference" in reason


@pytest.mark.parametrize("blank", ["", "  ", "\n"])
def test_blank_arguments_are_an_empty_object(blank: str) -> None:
    """OpenAI-compatible servers send "" for no-arg tools: read as {} (Symbiont denied it)."""
    assert validate_tool_arguments(call("now", blank), DEFINITIONS) is None
    assert validate_tool_arguments(call("mystery", blank), DEFINITIONS) is None


def test_blank_arguments_still_need_required_properties() -> None:
    """Blank arguments for a tool with required properties fail with the schema's message."""
    reason = validate_tool_arguments(call("file_read", ""), DEFINITIONS)
    assert reason == (
        "tool 'file_read' arguments failed schema validation: 'path' is a required property"
    )


def test_pointer_escapes_slash_and_tilde() -> None:
    """Property names with '/' or '~' are escaped in the path as RFC 6901 says."""
    schema = {"type": "object", "properties": {"a/b~c": {"type": "string"}}}
    reason = validate_tool_arguments(
        call("t", '{"a/b~c": 1}'), [ToolDefinition(name="t", parameters=schema)]
    )
    assert reason == (
        "tool 't' arguments failed schema validation: at '/a~1b~0c': 1 is not of type 'string'"
    )


def test_declared_draft_is_honoured() -> None:
    """A schema declaring draft-07 is validated as draft-07 (``items`` as a list is legal)."""
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {
            "pair": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}]}
        },
    }
    definitions = [ToolDefinition(name="t", parameters=schema)]
    assert validate_tool_arguments(call("t", '{"pair": ["a", 1]}'), definitions) is None
    reason = validate_tool_arguments(call("t", '{"pair": ["a", "b"]}'), definitions)
    assert (
        reason
        == "tool 't' arguments failed schema validation: at '/pair/1': 'b' is not of type 'integer'"
    )


def test_messages_the_model_sees() -> None:
    """The feedback texts are exactly Symbiont's."""
    assert denial_message("no") == "[Policy denied] no"
    assert schema_failure_message("bad") == "[Schema validation failed] bad"


def test_a_schema_checked_again_is_checked_against_itself() -> None:
    """The same definitions checked call after call keep giving each schema's own verdict,
    and so do many new schemas, past the memo of canonical texts (which then starts again)."""
    for _ in range(3):
        assert validate_tool_arguments(call("file_read", '{"path": "a.py"}'), DEFINITIONS) is None
        assert validate_tool_arguments(call("file_read", "{}"), DEFINITIONS) is not None
    for minimum in range(520):
        schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": minimum}}}
        definitions = [ToolDefinition(name="count", parameters=schema)]
        assert validate_tool_arguments(call("count", f'{{"n": {minimum}}}'), definitions) is None
        reason = validate_tool_arguments(call("count", f'{{"n": {minimum - 1}}}'), definitions)
        assert reason is not None and f"less than the minimum of {minimum}" in reason
