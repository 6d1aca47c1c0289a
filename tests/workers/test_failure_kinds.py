"""Worker failures carry a typed kind on the wire: configuration errors and outages of the
provider or the policy engine are told apart from the rest without matching strings."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.errors import ConfigError, PolicyUnavailableError, ProviderUnavailableError
from workers.handlers import failure_kind, prepare_workspace
from workers.providers import (
    AuthenticationError,
    InferenceTimeoutError,
    InvalidRequestError,
    ModelUnavailableError,
    ProviderError,
    RateLimitedError,
    ScriptError,
)
from workers.providers._http import Endpoint, HttpAnswer, status_error


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (ScriptError("cannot read the script"), "config"),
        (ConfigError("no API key"), "config"),
        (AuthenticationError("key rejected"), "config"),
        (ModelUnavailableError("no such model"), "config"),
        (RateLimitedError("429", retry_after_s=1.0), "provider_unavailable"),
        (ProviderError("HTTP 503"), "provider_unavailable"),
        (InferenceTimeoutError("no answer"), "provider_unavailable"),
        (ProviderUnavailableError("HTTP 503", service="openai"), "provider_unavailable"),
        (PolicyUnavailableError("OPA unreachable", service="opa at x"), "policy_unavailable"),
        (TimeoutError(), "transient"),
        (InvalidRequestError("HTTP 400"), "internal"),
        (RuntimeError("bug"), "internal"),
    ],
)
def test_failure_kind(error: Exception, kind: str) -> None:
    """Each failure maps to its kind: configuration, an outage of the provider or the policy
    engine, transient or internal."""
    assert failure_kind(error) == kind


@pytest.mark.parametrize("status", [401, 403, 404])
def test_rejected_key_and_unknown_model_are_configuration_errors(status: int) -> None:
    """A provider's 401/403 (the key) and 404 (the model) are ConfigErrors naming the fix."""
    endpoint = Endpoint("openai", "http://model.test/v1", "ORGA_API_KEY")
    response = HttpAnswer(
        status, "", {"content-type": "application/json"}, b'{"error": {"message": "nope"}}'
    )
    error = status_error(response, endpoint, endpoint.url("chat/completions"), "gpt-test")
    assert isinstance(error, ConfigError)
    assert "ORGA_API_KEY" in str(error) or "ORGA_MODEL" in str(error)


def test_a_missing_template_is_a_configuration_error(tmp_path: Path) -> None:
    """A workspace template that is not a folder is refused as a ConfigError naming it."""
    missing = tmp_path / "no-such-template"
    with pytest.raises(ConfigError, match="no-such-template"):
        prepare_workspace(tmp_path / "ws", str(missing))
    assert not (tmp_path / "ws").exists()
