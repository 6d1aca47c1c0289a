"""Approval of one tool call: what a gate's ``Ask`` holds, and the decisions a reviewer takes.

A gate answers :class:`~shared.actions.Ask` for a call a human must see first. The reasoning
worker sends the call back as a :class:`HeldCall` (with its tool's input schema) instead of
running it; the coordinator opens a review of source ``call`` and runs the turn's other calls
meanwhile. The reviewer then

- ``approve``\\ s it: the call runs as proposed;
- ``edit``\\ s it: the call runs with the reviewer's ``arguments``, which must satisfy the tool's
  input schema (:func:`check_arguments` names the field that does not; nothing is sent then);
- ``reject``\\ s it with a ``message``: the model reads it as the call's result
  (:func:`rejection_text`), and the loop goes on;
- or ``abort``\\ s the whole task.

:class:`DecisionRequest` is the body of a decision as every channel takes it (the CLI, the
inbox, the HTTP API): one model, validated once where it enters.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.actions import ToolCallAction
from shared.errors import OrgaError

if TYPE_CHECKING:
    from jsonschema import ValidationError

__all__ = [
    "CALL_DECISIONS",
    "MAX_DECISION_MESSAGE_CHARS",
    "ArgumentsError",
    "DecisionError",
    "DecisionKind",
    "DecisionRequest",
    "HeldCall",
    "check_arguments",
    "edited_call",
    "rejection_text",
]

DecisionKind = Literal["retry", "skip", "abort", "approve", "revise", "edit", "reject"]
"""Every decision a review takes: ``retry``/``skip``/``abort`` an escalated step,
``approve``/``revise`` a step's result, ``approve``/``edit``/``reject``/``abort`` a held call."""

CALL_DECISIONS: tuple[DecisionKind, ...] = ("approve", "edit", "reject", "abort")
"""The decisions a review of one held call (source ``call``) takes."""

MAX_DECISION_MESSAGE_CHARS = 8000
"""A decision's message (a hint, a revision's reason, a rejection the model reads) is capped."""


class DecisionError(OrgaError, ValueError):
    """A decision the review does not take (a step's decision for a held call, say)."""


class ArgumentsError(DecisionError):
    """A reviewer's edited arguments do not fit the tool's input schema (or are not an object)."""


class HeldCall(BaseModel):
    """A tool call the gate asked a human about: the call, the gate's reason, and the input
    schema of its tool (what an edit is checked against; None when the tool declares none)."""

    model_config = ConfigDict(frozen=True)

    call: ToolCallAction
    reason: str
    input_schema: dict[str, Any] | None = None


class DecisionRequest(BaseModel):
    """One decision on one review, as the CLI, the inbox and the HTTP API take it.

    ``message`` is the hint of a ``retry``, the reason of a ``revise`` (required), or the text
    the model reads for a ``reject`` (a default text when empty). ``arguments`` is the whole
    new argument object of an ``edit`` (required there, refused elsewhere).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    decision: DecisionKind
    message: str | None = Field(default=None, max_length=MAX_DECISION_MESSAGE_CHARS)
    arguments: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _fields_fit_the_decision(self) -> DecisionRequest:
        if self.decision == "edit" and self.arguments is None:
            raise ValueError(
                "arguments: an edit needs the new arguments, a JSON object such as "
                '{"command": "git push origin feature"}'
            )
        if self.decision != "edit" and self.arguments is not None:
            raise ValueError(
                f"arguments: only an edit takes arguments, not {self.decision!r}; "
                "use decision 'edit' or leave arguments out"
            )
        if self.decision == "revise" and not (self.message or "").strip():
            raise ValueError("message: a revision needs its reason (what the worker must change)")
        return self

    def arguments_json(self) -> str:
        """The edited arguments as compact JSON text ("" when this is not an edit)."""
        if self.arguments is None:
            return ""
        return json.dumps(self.arguments, separators=(",", ":"), ensure_ascii=False)


def check_arguments(tool: str, arguments: Any, schema: dict[str, Any] | None) -> dict[str, Any]:
    """``arguments`` when they are a JSON object satisfying ``schema``; ArgumentsError naming
    every field that does not (``at 'remote': 3 is not of type 'string'``) otherwise."""
    if not isinstance(arguments, dict):
        raise ArgumentsError(
            f"arguments for {tool!r} must be a JSON object, got {type(arguments).__name__}; "
            'write them as {"name": value, ...}'
        )
    if schema is None:
        return arguments
    # jsonschema (with attrs, referencing and its metaschemas, about 4 MB) is imported here,
    # at the first edited call, not by every process that imports this module: the
    # coordinator checks an edit only when a reviewer makes one (issue 27).
    from jsonschema import validators
    from jsonschema.exceptions import SchemaError

    try:
        cls = validators.validator_for(schema)
        cls.check_schema(schema)
        errors = sorted(cls(schema).iter_errors(arguments), key=lambda e: list(e.path))
    except SchemaError as exc:
        raise ArgumentsError(
            f"tool {tool!r} declares an invalid input schema ({exc.message}); "
            "no edit can be checked against it: approve or reject the call"
        ) from exc
    if errors:
        listed = "; ".join(_describe(error) for error in errors)
        raise ArgumentsError(
            f"edited arguments for {tool!r} do not fit its input schema: {listed}; fix them "
            "and decide again (the review stays open, nothing was sent)"
        )
    return arguments


def edited_call(call: ToolCallAction, arguments: dict[str, Any]) -> ToolCallAction:
    """The held call with the reviewer's arguments (same id: the model's tool_use is answered)."""
    text = json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)
    return call.model_copy(update={"arguments": text})


def rejection_text(message: str | None, decided_by: str) -> str:
    """What the model reads as the result of a call a reviewer rejected."""
    said = (message or "").strip() or "no reason given; do not run this call again as proposed"
    return f"[Rejected by reviewer {decided_by}] {said}"


def _describe(error: ValidationError) -> str:
    where = "/".join(str(part) for part in error.absolute_path)
    return f"at '{where}': {error.message}" if where else error.message
