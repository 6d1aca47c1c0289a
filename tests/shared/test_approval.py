"""The decision model every channel takes (CLI, inbox, HTTP API) and the check of an edit's
arguments against the tool's input schema."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.actions import ToolCallAction
from shared.approval import ArgumentsError, DecisionRequest, check_arguments, rejection_text

SCHEMA = {
    "type": "object",
    "properties": {"command": {"type": "string"}, "env": {"type": "object"}},
    "required": ["command"],
    "additionalProperties": False,
}


def test_decision_kinds_and_their_fields() -> None:
    """An edit needs arguments and only an edit takes them; a revision needs its reason."""
    edit = DecisionRequest(decision="edit", arguments={"command": "ls"})
    assert edit.arguments_json() == '{"command":"ls"}'
    assert DecisionRequest(decision="reject", message="no").message == "no"
    assert DecisionRequest(decision="approve").arguments_json() == ""
    with pytest.raises(ValidationError, match="an edit needs the new arguments"):
        DecisionRequest(decision="edit")
    with pytest.raises(ValidationError, match="only an edit takes arguments"):
        DecisionRequest(decision="approve", arguments={})
    with pytest.raises(ValidationError, match="a revision needs its reason"):
        DecisionRequest(decision="revise")
    with pytest.raises(ValidationError, match="decision"):
        DecisionRequest.model_validate({"decision": "maybe"})
    with pytest.raises(ValidationError, match="Extra inputs"):
        DecisionRequest.model_validate({"decision": "approve", "hint": "x"})


def test_arguments_checked_against_the_schema() -> None:
    """Every failing field is named; a fitting object is returned as is."""
    assert check_arguments("run_command", {"command": "ls"}, SCHEMA) == {"command": "ls"}
    with pytest.raises(ArgumentsError) as caught:
        check_arguments("run_command", {"command": 3, "env": "x", "extra": 1}, SCHEMA)
    message = str(caught.value)
    assert "at 'command': 3 is not of type 'string'" in message
    assert "at 'env': 'x' is not of type 'object'" in message
    assert "'extra' was unexpected" in message
    assert "the review stays open, nothing was sent" in message
    with pytest.raises(ArgumentsError, match="must be a JSON object, got list"):
        check_arguments("run_command", [], SCHEMA)
    assert check_arguments("anything", {"x": 1}, None) == {"x": 1}
    with pytest.raises(ArgumentsError, match="declares an invalid input schema"):
        check_arguments("odd", {}, {"type": "nonsense"})


def test_rejection_text() -> None:
    """The model reads who rejected the call and why (a default when no message was given)."""
    assert rejection_text("use a branch", "ann") == "[Rejected by reviewer ann] use a branch"
    assert "no reason given" in rejection_text("  ", "ann")
    assert ToolCallAction(call_id="c", name="t").arguments == "{}"
