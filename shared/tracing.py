"""One OpenTelemetry span per ORGA phase, named ``orga.<phase>``, through the API only.

Without an SDK configured at the process edge (:mod:`workers.telemetry`, from the standard
``OTEL_*`` variables) the API's tracer is a no-op, so spans cost next to nothing and nothing is
exported. Each span carries ``orga.task_id``, ``orga.step_id``, ``orga.iteration`` and
``orga.agent_id`` (those that are known)::

    with phase_span("reason", task_id=task.id, step_id=step.id, iteration=3, agent_id="coder"):
        response = await provider.complete(...)

**One task is one trace**, across coordinators and workers and across restarts: its trace id
is derived from the task id (:func:`task_context`), every span the coordinator opens for the
task is a child of that context, and every dispatch carries the W3C ``traceparent`` of the
coordinator's span that sent it (:func:`traceparent`), so a worker's spans are children of it
(:func:`context_of`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Final, Literal, get_args

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = [
    "PHASES",
    "TRACER_NAME",
    "Phase",
    "context_of",
    "phase_attributes",
    "phase_span",
    "span_name",
    "task_context",
    "task_trace_id",
    "task_traceparent",
    "traceparent",
    "tracing_installed",
]

TRACER_NAME: Final = "orga-queue"

Phase = Literal["reason", "gate", "act", "observe", "pre_hydrate", "verify", "decide"]
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


_GLOBAL_TRACER: Final = trace.get_tracer(TRACER_NAME)
"""The global provider's tracer, got once: OpenTelemetry's API hands out a proxy that follows
the SDK provider installed later (``get_tracer`` on every span looked the provider up in
``os.environ`` each time: about 3 % of a reasoning worker's CPU per model call, issue 27)."""


@contextmanager
def phase_span(
    phase: str,
    *,
    task_id: str | None = None,
    step_id: str | None = None,
    iteration: int | None = None,
    agent_id: str | None = None,
    tracer_provider: trace.TracerProvider | None = None,
    parent: Context | None = None,
) -> Iterator[trace.Span]:
    """Open the span of one phase (``"reason"`` or ``"orga.reason"``) as the current span.

    Exceptions are recorded on the span and propagate.

    ``tracer_provider`` defaults to the global one (a no-op unless an SDK is installed).
    With no SDK installed and no provider given, no span is opened at all (the API's no-op
    would record nothing): the body runs under :data:`~opentelemetry.trace.INVALID_SPAN`, in
    the caller's context.
    """
    if tracer_provider is None and not tracing_installed():
        yield trace.INVALID_SPAN
        return
    tracer = (
        _GLOBAL_TRACER
        if tracer_provider is None
        else trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)
    )
    attributes = phase_attributes(
        task_id=task_id, step_id=step_id, iteration=iteration, agent_id=agent_id
    )
    with tracer.start_as_current_span(
        span_name(phase), context=parent, attributes=attributes
    ) as span:
        yield span


_PROPAGATOR = TraceContextTextMapPropagator()


def task_trace_id(task_id: str) -> int:
    """The trace id of a task: the same in every process, for the task's whole life."""
    return int.from_bytes(hashlib.blake2b(task_id.encode(), digest_size=16).digest(), "big") or 1


def task_context(task_id: str) -> Context:
    """A context whose (remote) parent is the task's root: spans opened in it join the
    task's trace."""
    span_id = int.from_bytes(
        hashlib.blake2b(task_id.encode(), digest_size=8, person=b"orga-root").digest(), "big"
    )
    root = trace.SpanContext(
        trace_id=task_trace_id(task_id),
        span_id=span_id or 1,
        is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(root))


def traceparent(span: trace.Span) -> str | None:
    """The W3C ``traceparent`` of ``span`` (None when it is not a valid, recorded span)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


def tracing_installed() -> bool:
    """Whether an SDK's tracer provider is installed; without one every span is the API's
    no-op, which records nothing and only hands its parent's context on."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


@lru_cache(maxsize=4096)
def task_traceparent(task_id: str) -> str | None:
    """The ``traceparent`` of the task's root: what a span opened in :func:`task_context`
    carries when no SDK is installed (the no-op span is its parent's), without opening it."""
    return traceparent(trace.get_current_span(task_context(task_id)))


def context_of(parent: str | None, task_id: str) -> Context:
    """The context a worker opens its spans in: the dispatch's ``traceparent``, else the
    task's root."""
    if parent:
        context = _PROPAGATOR.extract({"traceparent": parent})
        if trace.get_current_span(context).get_span_context().is_valid:
            return context
    return task_context(task_id)
