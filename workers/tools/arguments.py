"""Checking a tool's arguments against its own JSON Schema.

The Gate phase validates arguments before any tool runs; the built-in tools check again, so that
they are safe to call directly (a test, a script, a third-party executor).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from jsonschema import Draft202012Validator

from shared.inference import ToolDefinition
from workers.tools.base import ToolContext, ToolOutput
from workers.tools.output import error_output

__all__ = ["ArgumentCheck", "BlockingTool"]


class ArgumentCheck:
    """Validates arguments against one tool definition's ``parameters`` (Draft 2020-12)."""

    def __init__(self, definition: ToolDefinition) -> None:
        Draft202012Validator.check_schema(definition.parameters)
        self._name = definition.name
        self._validator = Draft202012Validator(definition.parameters)

    def failure(self, arguments: Mapping[str, Any], **metadata: str) -> ToolOutput | None:
        """An ``is_error`` output listing every schema error, or None when the arguments fit."""
        errors = sorted(self._validator.iter_errors(dict(arguments)), key=lambda e: list(e.path))
        if not errors:
            return None
        details = "; ".join(
            f"at '{'/'.join(str(part) for part in error.path)}': {error.message}"
            if error.path
            else error.message
            for error in errors
        )
        return error_output(
            f"invalid arguments for {self._name}: {details}",
            error_type="invalid_arguments",
            **metadata,
        )


class BlockingTool(ABC):
    """A tool whose work is a blocking function of (arguments, context): the arguments are
    checked against the tool's own schema, then ``work`` runs in a worker thread.

    Subclasses set ``DEFINITION`` and ``KIND`` (the detector's kind reported on argument
    errors) and implement ``work``.
    """

    DEFINITION: ClassVar[ToolDefinition]
    KIND: ClassVar[str]

    @abstractmethod
    def work(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
        """The blocking work, on arguments that fit the schema."""

    def __init__(self) -> None:
        self._check = ArgumentCheck(self.DEFINITION)

    @property
    def definition(self) -> ToolDefinition:
        """Name, description and JSON Schema of the tool."""
        return self.DEFINITION

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolOutput:
        """Do the work, or explain why not as an ``is_error`` output. Arguments that passed
        this very schema in this process under Draft 2020-12, as this check is
        (``context.checked_schema``: the gate's pre-check of an inline call) are not checked
        again."""
        if context.checked_schema is not self.DEFINITION.parameters:
            failure = self._check.failure(arguments, kind=self.KIND)
            if failure is not None:
                return failure
        inline = self.work_inline(arguments, context)
        if inline is not None:
            return inline
        return await asyncio.to_thread(self.work, arguments, context)

    def work_inline(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput | None:
        """The work done on the event loop itself, when it is short enough to spare the
        hand-off to a thread and back (a wake-up of the thread, the GIL passed twice, a wake-up
        of the loop); None when it is not, and ``work`` then runs in a thread. A subclass that
        does work here must bound it: the call's timeout cannot interrupt the loop. None
        unless a subclass says otherwise."""
        return None
