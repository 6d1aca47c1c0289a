"""The OTEL_* variables, read at the process edge, choose the span exporters."""

from __future__ import annotations

import pytest

from shared.errors import ConfigError
from shared.settings import TelemetrySettings
from workers.telemetry import configure_tracing


def test_no_variable_means_no_exporter() -> None:
    """Tracing stays a no-op unless an exporter or an OTLP endpoint is configured."""
    assert TelemetrySettings().exporters() == []
    assert configure_tracing(TelemetrySettings(), "orga-test") is None


def test_an_endpoint_alone_means_otlp_and_the_list_is_honoured() -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT implies otlp; OTEL_TRACES_EXPORTER lists, none removes."""
    assert TelemetrySettings(exporter_otlp_endpoint="http://c:4318").exporters() == ["otlp"]
    chosen = TelemetrySettings(traces_exporter="console, OTLP", exporter_otlp_endpoint="x")
    assert chosen.exporters() == ["console", "otlp"]
    assert TelemetrySettings(traces_exporter="none").exporters() == []
    assert TelemetrySettings(traces_exporter="console", sdk_disabled=True).exporters() == []


def test_the_environment_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The standard variable names are the ones read."""
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "svc")
    settings = TelemetrySettings()
    assert (settings.exporters(), settings.service_name) == (["console"], "svc")


def test_an_unknown_exporter_is_refused_with_the_choices() -> None:
    """A typo in OTEL_TRACES_EXPORTER names the value and what is supported."""
    with pytest.raises(ConfigError, match=r"unknown exporter 'consol'; .*console, otlp or none"):
        configure_tracing(TelemetrySettings(traces_exporter="consol"), "orga-test")
