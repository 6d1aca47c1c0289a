"""Tools for benchmarks: ``noop`` costs nothing, ``slow`` takes a fixed time.

``noop`` answers ``ok`` at once: no process, no file, no network. Its metadata says
``kind=other`` with a per-call ``output_hash`` (the call's ``n`` argument), so a detector that
is left on sees informative, never repeated, output. ``slow`` waits ``SLOW_TOOL_S`` (without
using the CPU) and echoes its ``input``: a stand-in for a fetch, to time pre-hydration.
"""

from __future__ import annotations

import asyncio
from typing import Any

from shared.inference import ToolDefinition
from workers.tools.base import ToolContext, ToolOutput

__all__ = [
    "NOOP_DEFINITION",
    "RAW_QUEUE",
    "RAW_TASK_NAME",
    "SLOW_DEFINITION",
    "SLOW_TOOL_S",
    "NoopTool",
    "SlowTool",
]

RAW_TASK_NAME = "bench.noop"
"""The raw no-op Celery task of ``bench/noop_worker.py`` (the substrate measurement)."""
RAW_QUEUE = "bench.noop"
"""Its queue, consumed by the benchmark's worker beside the orga queues."""

NOOP_DEFINITION = ToolDefinition(
    name="noop",
    description="Does nothing and answers 'ok' (benchmarks only).",
    parameters={
        "type": "object",
        "properties": {
            "n": {"type": "integer", "description": "any number, echoed back"},
            "bytes": {"type": "integer", "minimum": 0, "description": "pad the answer to this"},
        },
        "additionalProperties": False,
    },
)


class NoopTool:
    """Implements :class:`workers.tools.base.Tool`; returns at once."""

    @property
    def definition(self) -> ToolDefinition:
        """``noop(n?: int)``."""
        return NOOP_DEFINITION

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolOutput:
        """``ok``, with the call's ``n`` as the output hash (padded to ``bytes``, if given)."""
        n = str(arguments.get("n", 0))
        content = f"ok {n}".ljust(int(arguments.get("bytes", 0)), ".")
        return ToolOutput(content=content, metadata={"kind": "other", "output_hash": n})


SLOW_TOOL_S = 0.2
"""How long ``slow`` takes."""

SLOW_DEFINITION = ToolDefinition(
    name="slow",
    description=f"Waits {SLOW_TOOL_S * 1000:.0f} ms and echoes its input (benchmarks only).",
    parameters={
        "type": "object",
        "properties": {"input": {"type": "string", "description": "echoed back"}},
        "required": ["input"],
        "additionalProperties": False,
    },
)


class SlowTool:
    """Implements :class:`workers.tools.base.Tool`; waits, then answers."""

    @property
    def definition(self) -> ToolDefinition:
        """``slow(input: str)``."""
        return SLOW_DEFINITION

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolOutput:
        """The input, after ``SLOW_TOOL_S`` seconds."""
        await asyncio.sleep(SLOW_TOOL_S)
        text = str(arguments.get("input", ""))
        return ToolOutput(content=f"resolved {text}", metadata={"kind": "read"})
