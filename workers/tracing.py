"""One OpenTelemetry span per ORGA phase, named ``orga.<phase>``, through the API only.

Without an SDK configured by the operator the API's tracer is a no-op, so spans cost next to
nothing and nothing is exported. Each span carries ``orga.task_id``, ``orga.step_id``,
``orga.iteration`` and ``orga.agent_id`` (those that are known)::

    with phase_span("reason", task_id=task.id, step_id=step.id, iteration=3, agent_id="coder"):
        response = await provider.complete(...)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final, Literal, get_args

from opentelemetry import trace

__all__ = [
    "PHASES",
    "TRACER_NAME",
    "Phase",
    "phase_attributes",
    "phase_span",
    "span_name",
]

TRACER_NAME: Final = "orga-queue"

Phase = Literal["reason", "gate", "act", "observe", "pre_hydrate"]
PHASES: Final[tuple[str, ...]] = get_args(Phase)
_SPAN_PREFIX: Final = "orga."


def span_name(phase: str) -> str:
    """``orga.<phase>`` for ``"reason"`` or ``"orga.reason"`` alike.

    Raises ValueError for a phase that is not one of ``PHASES``.
    """
    bare = phase.removeprefix(_SPAN_PREFIX)
    if bare not in PHASES:
        raise ValueError(f"unknown ORGA phase {phase!r}; use one of {', '.join(PHASES)}")
    return f"{_SPAN_PREFIX}{bare}"


def phase_attributes(
    *,
    task_id: str | None = None,
    step_id: str | None = None,
    iteration: int | None = None,
    agent_id: str | None = None,
) -> dict[str, str | int]:
    """The span attributes, without the values that are None."""
    values: dict[str, str | int | None] = {
        "orga.task_id": task_id,
        "orga.step_id": step_id,
        "orga.iteration": iteration,
        "orga.agent_id": agent_id,
    }
    return {key: value for key, value in values.items() if value is not None}


@contextmanager
def phase_span(
    phase: str,
    *,
    task_id: str | None = None,
    step_id: str | None = None,
    iteration: int | None = None,
    agent_id: str | None = None,
    tracer_provider: trace.TracerProvider | None = None,
) -> Iterator[trace.Span]:
    """Open the span of one phase (``"reason"`` or ``"orga.reason"``) as the current span.

    Exceptions are recorded on the span and propagate.

    ``tracer_provider`` defaults to the global one (a no-op unless an SDK is installed).
    """
    tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)
    attributes = phase_attributes(
        task_id=task_id, step_id=step_id, iteration=iteration, agent_id=agent_id
    )
    with tracer.start_as_current_span(span_name(phase), attributes=attributes) as span:
        yield span
