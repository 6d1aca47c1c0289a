"""The schema pre-check of the Gate phase (Symbiont §1.5, step 1) and the texts the model sees.

A tool call's arguments are checked before any policy gate is consulted:

1. they must parse as JSON (``NaN`` and ``Infinity`` are refused, as serde refuses them);
2. they must be a JSON object;
3. when a tool of that name is declared, the object must satisfy its JSON Schema; every error
   is reported, joined with ``"; "``, each prefixed ``at '<JSON pointer>': `` when it is not
   about the root;
4. a declared schema that is itself invalid, or whose ``$ref`` cannot be resolved, refuses
   the call (fail closed).

Improvement over Symbiont: an empty or blank argument string is read as ``{}``, as
:meth:`shared.actions.ToolCallAction.parsed_arguments` does. OpenAI-compatible servers send
``""`` for tools without parameters; Symbiont denied those calls as invalid JSON. A blank string
for a tool whose schema requires properties still fails, with the schema's own message
(``'path' is a required property``), which tells the model what to send.

Schemas are compiled once per distinct schema (keyed by its canonical JSON text). The
canonical text of a schema object already seen is remembered with the object itself (the
registry's tools offer the same definitions call after call: 19 µs of a 72 µs check was
putting file_read's schema in canonical JSON again), so a schema must not be changed in
place once checked (a :class:`ToolDefinition` is frozen; its ``parameters`` are never
written). The validator class follows the schema's ``$schema`` keyword and defaults to
Draft 2020-12.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from typing import Any

from jsonschema import Draft202012Validator, ValidationError, validators
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from referencing.exceptions import Unresolvable

from shared.actions import ToolCallAction
from shared.inference import ToolDefinition

__all__ = [
    "DENIAL_PREFIX",
    "SCHEMA_FAILURE_PREFIX",
    "checks_as_draft_2020_12",
    "denial_message",
    "schema_failure_message",
    "validate_tool_arguments",
]

DENIAL_PREFIX = "[Policy denied]"
SCHEMA_FAILURE_PREFIX = "[Schema validation failed]"

_JSON_TYPE_NAMES: dict[type, str] = {
    type(None): "null",
    bool: "boolean",
    int: "number",
    float: "number",
    str: "string",
    list: "array",
}


def denial_message(reason: str) -> str:
    """The tool-result text the model sees for an action the gate denied."""
    return f"{DENIAL_PREFIX} {reason}"


def schema_failure_message(reason: str) -> str:
    """The tool-result text the model sees for arguments that failed the schema pre-check."""
    return f"{SCHEMA_FAILURE_PREFIX} {reason}"


def validate_tool_arguments(
    action: ToolCallAction, definitions: Iterable[ToolDefinition]
) -> str | None:
    """None when the arguments may go to the gate, otherwise the reason they may not."""
    name = action.name
    try:
        arguments = _parse_json(action.arguments)
    except ValueError as exc:
        return f"tool '{name}' arguments are not valid JSON: {exc}"
    except RecursionError:
        return f"tool '{name}' arguments are not valid JSON: nested too deeply to parse"
    if not isinstance(arguments, dict):
        kind = _JSON_TYPE_NAMES.get(type(arguments), type(arguments).__name__)
        return f"tool '{name}' arguments must be a JSON object, got {kind}"
    definition = _find_definition(name, definitions)
    if definition is None:
        return None
    return _check_against_schema(name, arguments, definition.parameters)


def _parse_json(text: str) -> Any:
    """The JSON value of ``text``; blank text is ``{}``; NaN and Infinity are refused."""
    if not text.strip():
        return {}
    return json.loads(text, parse_constant=_refuse_constant)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _find_definition(name: str, definitions: Iterable[ToolDefinition]) -> ToolDefinition | None:
    return next((d for d in definitions if d.name == name), None)


def _check_against_schema(
    name: str, arguments: dict[str, Any], schema: dict[str, Any]
) -> str | None:
    """The schema-validation reason, or the fail-closed reason for a broken schema."""
    try:
        validator = _compiled_validator(_canonical_of(schema))
        errors = sorted(validator.iter_errors(arguments), key=_error_sort_key)
    except SchemaError as exc:
        return _invalid_schema(name, f"{_pointer_prefix(exc.path)}{exc.message}")
    except Unresolvable as exc:
        return _invalid_schema(name, f"unresolvable reference: {exc}")
    if not errors:
        return None
    details = "; ".join(_brief(f"{_pointer_prefix(e.path)}{e.message}") for e in errors[:10])
    if len(errors) > 10:
        details += f"; ... and {len(errors) - 10} more"
    return f"tool '{name}' arguments failed schema validation: {details}"


_DETAIL_CHARS = 300


def _brief(text: str) -> str:
    """One error, cut so that a huge argument value is not quoted back whole to the model."""
    if len(text) <= _DETAIL_CHARS:
        return text
    return f"{text[: _DETAIL_CHARS - 40]}... ({len(text)} characters)"


def _invalid_schema(name: str, error: str) -> str:
    return f"tool '{name}' has an invalid declared schema (refusing to dispatch): {error}"


def _canonical(schema: dict[str, Any]) -> str:
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


_SEEN_SCHEMAS = 512
_seen: dict[int, tuple[dict[str, Any], str]] = {}
"""``id(schema)`` → the schema and its canonical text. The entry holds the schema, so its
``id`` is not reused while it is here; a full memo starts again empty (a request's own
schemas are new objects at every call and only pass through)."""


def _canonical_of(schema: dict[str, Any]) -> str:
    """:func:`_canonical` of ``schema``, remembered for this very object."""
    seen = _seen.get(id(schema))
    if seen is not None and seen[0] is schema:
        return seen[1]
    text = _canonical(schema)
    if len(_seen) >= _SEEN_SCHEMAS:
        _seen.clear()
    _seen[id(schema)] = (schema, text)
    return text


@functools.lru_cache(maxsize=512)
def _compiled_validator(schema_json: str) -> Validator:
    """A checked validator for the schema; raises SchemaError when the schema is invalid."""
    schema = json.loads(schema_json)
    cls = validators.validator_for(schema, default=Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def checks_as_draft_2020_12(offered: dict[str, Any], own: dict[str, Any]) -> bool:
    """True when arguments that passed this pre-check against ``offered`` pass a Draft 2020-12
    check against ``own`` (a tool's own check, :class:`workers.tools.arguments.ArgumentCheck`):
    both schemas have the same canonical JSON text (not Python ``==``, for which ``1 == True``
    and ``1 == 1.0``), and the pre-check validates that schema under Draft 2020-12 (it has no
    ``$schema``, or 2020-12's: under another draft the same schema may accept what 2020-12
    refuses, e.g. draft-07 ignores a keyword beside ``$ref``). False for a schema that is
    itself invalid (the pre-check refused the call then)."""
    canonical = _canonical_of(own)
    if offered is not own and _canonical_of(offered) != canonical:
        return False
    try:
        return type(_compiled_validator(canonical)) is Draft202012Validator
    except (SchemaError, Unresolvable):
        return False


def _error_sort_key(error: ValidationError) -> tuple[list[str], str]:
    return [str(part) for part in error.path], error.message


def _pointer_prefix(path: Iterable[str | int]) -> str:
    """``at '/a/0': `` for a non-empty instance path (RFC 6901 escaping), else ``""``."""
    parts = [str(p).replace("~", "~0").replace("/", "~1") for p in path]
    return f"at '/{'/'.join(parts)}': " if parts else ""
