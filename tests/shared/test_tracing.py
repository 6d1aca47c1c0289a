"""Phase spans: names, attributes, and harmless with the API's no-op tracer."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.util.types import Attributes

from shared.tracing import PHASES, TRACER_NAME, phase_attributes, phase_span, span_name


class _RecordingTracer(trace.Tracer):
    """Records the spans opened through it (the API has no recording tracer without an SDK)."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, dict[str, Any]]] = []

    def start_span(self, name: str, *args: Any, **kwargs: Any) -> trace.Span:
        return trace.INVALID_SPAN

    @contextmanager
    def start_as_current_span(  # type: ignore[override]
        self, name: str, *args: Any, attributes: Attributes = None, **kwargs: Any
    ) -> Iterator[trace.Span]:
        self.spans.append((name, dict(attributes or {})))
        yield trace.INVALID_SPAN


class _RecordingProvider(trace.TracerProvider):
    def __init__(self) -> None:
        self.tracer = _RecordingTracer()
        self.names: list[str] = []

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Attributes = None,
    ) -> trace.Tracer:
        self.names.append(instrumenting_module_name)
        return self.tracer


def test_phase_attributes_skip_none() -> None:
    """Known values become orga.* attributes; None values are left out."""
    assert phase_attributes(task_id="t1", step_id="s1", iteration=0, agent_id="coder") == {
        "orga.task_id": "t1",
        "orga.step_id": "s1",
        "orga.iteration": 0,
        "orga.agent_id": "coder",
    }
    assert phase_attributes(iteration=2) == {"orga.iteration": 2}
    assert phase_attributes() == {}


@pytest.mark.parametrize("phase", PHASES)
def test_span_names(phase: str) -> None:
    """Every phase has an orga.<phase> span, named with or without the prefix."""
    assert span_name(phase) == f"orga.{phase}"
    assert span_name(f"orga.{phase}") == f"orga.{phase}"


def test_span_names_cover_the_orga_phases() -> None:
    """The phases: the loop's own, the verification check, and the coordinator's decision."""
    assert set(PHASES) == {"reason", "gate", "act", "observe", "pre_hydrate", "verify", "decide"}


def test_unknown_phase_is_refused() -> None:
    """A phase outside the list is a ValueError naming it."""
    with pytest.raises(ValueError, match="'think'"):
        span_name("think")
    with pytest.raises(ValueError, match=r"'orga\.think'"):
        span_name("orga.think")


def test_phase_span_with_the_global_no_op_tracer() -> None:
    """Without an SDK the span is a no-op and the body runs normally."""
    with phase_span("reason", task_id="t1", step_id=None, iteration=1, agent_id="a") as span:
        assert not span.is_recording()
        ran = True
    assert ran


def test_phase_span_with_an_explicit_no_op_provider_lets_errors_through() -> None:
    """Errors in the body propagate unchanged through the span."""
    with pytest.raises(KeyError), phase_span("act", tracer_provider=trace.NoOpTracerProvider()):
        raise KeyError("boom")


def test_phase_span_opens_a_named_span_with_attributes() -> None:
    """The span is opened on the orga-queue tracer with the phase name and attributes."""
    provider = _RecordingProvider()
    with phase_span(
        "observe",
        task_id="t1",
        step_id="s2",
        iteration=3,
        agent_id="coder",
        tracer_provider=provider,
    ):
        pass
    assert provider.names == [TRACER_NAME]
    assert provider.tracer.spans == [
        (
            "orga.observe",
            {
                "orga.task_id": "t1",
                "orga.step_id": "s2",
                "orga.iteration": 3,
                "orga.agent_id": "coder",
            },
        )
    ]


def test_a_task_has_one_trace_id_everywhere_and_a_traceparent_round_trips() -> None:
    """The task's trace id is a function of its id; a dispatch's traceparent is its parent."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from shared.tracing import context_of, task_context, task_trace_id, traceparent

    assert task_trace_id("t-1") == task_trace_id("t-1") != task_trace_id("t-2")
    root = trace.get_current_span(task_context("t-1")).get_span_context()
    assert root.trace_id == task_trace_id("t-1") and root.is_remote
    provider = TracerProvider()
    with phase_span("decide", tracer_provider=provider, parent=task_context("t-1")) as span:
        parent = traceparent(span)
    assert parent is not None and f"{task_trace_id('t-1'):032x}" in parent
    child = trace.get_current_span(context_of(parent, "t-1")).get_span_context()
    assert child.span_id == span.get_span_context().span_id
    fallback = trace.get_current_span(context_of("garbage", "t-1")).get_span_context()
    assert fallback.trace_id == task_trace_id("t-1")
