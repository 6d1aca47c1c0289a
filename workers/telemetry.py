"""OpenTelemetry's SDK, configured once at a process edge from the standard ``OTEL_*`` variables.

Coordinators and workers call :func:`configure_tracing` when they start (``orga coordinator``,
``orga run``, each worker process after it forks). Without an exporter configured it does
nothing and the spans of :mod:`shared.tracing` stay no-ops::

    OTEL_TRACES_EXPORTER=console orga run examples/bugfix/task.yaml     # one JSON line a span
    OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 orga worker       # OTLP over HTTP

The console exporter writes one span a line (compact JSON) to standard output, so a span
never interleaves with a log line; OTLP spans are batched.
"""

from __future__ import annotations

import sys
import threading
from typing import TextIO

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)

from shared.errors import ConfigError
from shared.genai import capture_content
from shared.settings import TelemetrySettings

__all__ = ["EXPORTERS", "check_exporters", "configure_tracing", "flush_tracing"]

EXPORTERS = ("console", "otlp")

_lock = threading.Lock()
_provider: TracerProvider | None = None


def configure_tracing(
    settings: TelemetrySettings, service_name: str, out: TextIO | None = None
) -> TracerProvider | None:
    """Install the SDK's tracer provider with the configured exporters (once per process;
    None when no exporter is configured). An unknown exporter is a ConfigError naming it."""
    global _provider  # noqa: PLW0603
    names = check_exporters(settings)
    capture_content(settings.instrumentation_genai_capture_message_content)
    with _lock:
        if _provider is not None or not names:
            return _provider
        resource = Resource.create({SERVICE_NAME: settings.service_name or service_name})
        provider = TracerProvider(resource=resource)
        for name in names:
            provider.add_span_processor(_processor(name, out))
        trace.set_tracer_provider(provider)
        _provider = provider
        return provider


def check_exporters(settings: TelemetrySettings) -> list[str]:
    """The exporters ``settings`` ask for; a ConfigError naming an unknown one (checked when a
    process starts, before it takes any work)."""
    names = settings.exporters()
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER={settings.traces_exporter!r}: unknown exporter "
            f"{unknown[0]!r}; orga-queue exports to {', '.join(EXPORTERS)} or none"
        )
    return names


def flush_tracing() -> None:
    """Export what is buffered (a worker process calls it before it exits)."""
    if _provider is not None:
        _provider.force_flush()


def _processor(name: str, out: TextIO | None) -> SpanProcessor:
    if name == "console":
        exporter = ConsoleSpanExporter(out=out or sys.stdout, formatter=_one_line)
        return SimpleSpanProcessor(exporter)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return BatchSpanProcessor(OTLPSpanExporter())


def _one_line(span: ReadableSpan) -> str:
    return f"{span.to_json(indent=None)}\n"
