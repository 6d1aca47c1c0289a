"""What the stagnation detector sees of one tool call: a :class:`ToolEvent`.

A ``ToolEvent`` is derived mechanically from what the host already has, the
:class:`~shared.actions.ToolCallAction` the model proposed and the
:class:`~shared.actions.Observation` the tool returned. Our tools put the facts the detector needs
into ``Observation.metadata`` as strings:

=================  ========================================================================
``kind``           ``read``, ``write``, ``command`` or ``other`` (default ``other``)
``path``           the file or resource the call touched
``content_hash``   for reads: the hash of the whole content read (not of the page shown)
``before_hash``    for writes: the hash of the content before the write
``after_hash``     for writes: the hash of the content after the write
``exit_code``      for commands: the process exit code (an integer)
``output_hash``    a digest of the full output when ``content`` was truncated
=================  ========================================================================
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shared.actions import Observation, ToolCallAction

__all__ = ["ToolEvent", "ToolKind"]


class ToolKind(StrEnum):
    """What a tool call does to the world, as far as progress is concerned."""

    READ = "read"
    WRITE = "write"
    COMMAND = "command"
    OTHER = "other"


def _parse_exit_code(tool: str, value: str | None) -> int | None:
    if value is None or not value.strip():
        return None
    try:
        return int(value.strip())
    except ValueError:
        raise ValueError(
            f"tool {tool!r}: metadata exit_code must be an integer, got {value!r}; "
            "store the process exit status as a decimal string such as '0' or '2'"
        ) from None


def _parse_kind(tool: str, value: str | None) -> ToolKind:
    if value is None:
        return ToolKind.OTHER
    try:
        return ToolKind(value)
    except ValueError:
        known = ", ".join(k.value for k in ToolKind)
        raise ValueError(
            f"tool {tool!r}: metadata kind {value!r} is not one of {known}; "
            "set kind to one of these or leave it out (other)"
        ) from None


_KNOWN_KINDS = frozenset(k.value for k in ToolKind)


def _lenient_kind(value: str | None) -> str:
    return value if value in _KNOWN_KINDS else ToolKind.OTHER.value


def _lenient_exit_code(value: str | None) -> int | None:
    try:
        return int(value.strip()) if value is not None else None
    except ValueError:
        return None


def _arguments(action: ToolCallAction) -> dict[str, Any]:
    """The parsed arguments, or the raw text under ``_raw`` when they are not a JSON object."""
    try:
        return action.parsed_arguments()
    except ValueError:  # json.JSONDecodeError is a ValueError
        return {"_raw": action.arguments}


class ToolEvent(BaseModel):
    """One observed tool call: the call, what came back, and what it did to the world."""

    model_config = ConfigDict(frozen=True)

    tool_name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    output: str = ""
    exit_code: int | None = None
    kind: ToolKind = ToolKind.OTHER
    path: str | None = None
    content_hash: str | None = None
    before_hash: str | None = None
    after_hash: str | None = None
    output_hash: str | None = None
    is_error: bool = False

    @property
    def failed(self) -> bool:
        """True when the tool reported an error or the command exited non-zero."""
        return self.is_error or (self.exit_code is not None and self.exit_code != 0)

    @classmethod
    def from_observation(
        cls, action: ToolCallAction, observation: Observation, *, strict: bool = True
    ) -> ToolEvent:
        """Build the event from the call and its observation, reading ``observation.metadata``.

        Raises ValueError when the observation answers another call, or when ``kind`` or
        ``exit_code`` in the metadata are malformed (the message names the value and the fix).
        With ``strict=False`` (a host reading third-party tools' metadata) a malformed kind
        reads as ``other`` and a malformed exit code as unknown instead.
        """
        meta = observation.metadata
        if not strict:  # read as the action's answer, its metadata cleaned (no copy of it)
            meta = {**meta, "kind": _lenient_kind(meta.get("kind"))}
            if _lenient_exit_code(meta.get("exit_code")) is None:
                meta.pop("exit_code", None)
        elif observation.call_id is not None and observation.call_id != action.call_id:
            raise ValueError(
                f"observation answers call {observation.call_id!r}, not {action.call_id!r}; "
                "pair each observation with the ToolCallAction that has its call_id"
            )
        return cls(
            tool_name=action.name,
            arguments=_arguments(action),
            output=observation.content,
            exit_code=_parse_exit_code(action.name, meta.get("exit_code")),
            kind=_parse_kind(action.name, meta.get("kind")),
            path=meta.get("path"),
            content_hash=meta.get("content_hash"),
            before_hash=meta.get("before_hash"),
            after_hash=meta.get("after_hash"),
            output_hash=meta.get("output_hash"),
            is_error=observation.is_error,
        )

    def describe(self) -> str:
        """A short human-readable form of the call, for the texts shown to the model."""
        args = json.dumps(self.arguments, sort_keys=True, ensure_ascii=False, default=str)
        if len(args) > 80:
            args = args[:77] + "..."
        return f"{self.tool_name}({args})"
