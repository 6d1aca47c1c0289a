"""Provider settings from the environment, and the factory that builds providers from them."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from shared.conversation import Conversation, ConversationMessage
from shared.errors import ConfigError
from shared.inference import InferenceOptions
from tests.fakes.llm_server import (
    FIXTURES_DIR,
    FakeAnthropicServer,
    FakeOpenAIServer,
    RecordingSleep,
)
from workers.providers import (
    PROVIDER_DEFAULTS,
    AnthropicProvider,
    InferenceProvider,
    OnExhausted,
    OpenAICompatProvider,
    ProviderError,
    ProviderKind,
    ProviderSettings,
    ScriptedProvider,
    build_provider,
)

KEY = "sk-settings-test-key-0000"
KEY_VARS = ("OPENAI_API_KEY", "OPENROUTER_API_KEY", "ANTHROPIC_API_KEY")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ORGA_* or provider key variable from the machine leaks into these tests."""
    for name in list(os.environ):
        if name.startswith("ORGA_") or name in KEY_VARS:
            monkeypatch.delenv(name)


def ask(provider: InferenceProvider) -> str:
    """One completion's content."""
    conversation = Conversation(messages=[ConversationMessage.user("hi")])
    return asyncio.run(provider.complete(conversation, InferenceOptions())).content


# -- settings ------------------------------------------------------------------------------


def test_the_defaults_are_the_scripted_provider_and_production_limits() -> None:
    """With no environment: scripted, 120 s timeout, 3 retries, 60 s Retry-After cap."""
    settings = ProviderSettings()
    assert settings.provider is ProviderKind.SCRIPTED
    assert (settings.timeout_s, settings.max_retries, settings.retry_after_cap_s) == (120, 3, 60)
    assert settings.script_on_exhausted is OnExhausted.FINAL_ANSWER
    assert settings.resolved_api_key() is None
    assert settings.resolved_base_url() is None


def test_values_come_from_orga_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ORGA_* variable reaches its field; the provider name is case-insensitive."""
    monkeypatch.setenv("ORGA_PROVIDER", "OpenRouter")
    monkeypatch.setenv("ORGA_BASE_URL", "https://proxy.example/v1/")
    monkeypatch.setenv("ORGA_MODEL", "meta/llama")
    monkeypatch.setenv("ORGA_API_KEY", KEY)
    monkeypatch.setenv("ORGA_TIMEOUT_S", "30")
    monkeypatch.setenv("ORGA_MAX_RETRIES", "5")
    monkeypatch.setenv("ORGA_RETRY_AFTER_CAP_S", "10")
    monkeypatch.setenv("ORGA_OPENROUTER_REFERER", "https://example.org")
    monkeypatch.setenv("ORGA_OPENROUTER_TITLE", "orga")
    settings = ProviderSettings()
    assert settings.provider is ProviderKind.OPENROUTER
    assert settings.resolved_base_url() == "https://proxy.example/v1"
    assert settings.resolved_model() == "meta/llama"
    assert settings.resolved_api_key() == SecretStr(KEY)
    assert (settings.timeout_s, settings.max_retries, settings.retry_after_cap_s) == (30, 5, 10)
    assert (settings.openrouter_referer, settings.openrouter_title) == (
        "https://example.org",
        "orga",
    )


@pytest.mark.parametrize(
    ("provider", "base_url", "model", "key_var"),
    [
        ("openai", "https://api.openai.com/v1", "gpt-4o", "OPENAI_API_KEY"),
        (
            "openrouter",
            "https://openrouter.ai/api/v1",
            "anthropic/claude-sonnet-4",
            "OPENROUTER_API_KEY",
        ),
        (
            "anthropic",
            "https://api.anthropic.com/v1",
            "claude-sonnet-4-20250514",
            "ANTHROPIC_API_KEY",
        ),
    ],
)
def test_each_provider_has_its_defaults_and_conventional_key(
    monkeypatch: pytest.MonkeyPatch, provider: str, base_url: str, model: str, key_var: str
) -> None:
    """Base URL, model and the fallback key variable depend on the provider."""
    monkeypatch.setenv("ORGA_PROVIDER", provider)
    monkeypatch.setenv(key_var, KEY)
    settings = ProviderSettings()
    assert (settings.resolved_base_url(), settings.resolved_model()) == (base_url, model)
    assert settings.resolved_api_key() == SecretStr(KEY)
    assert settings.api_key_env_names() == ("ORGA_API_KEY", key_var)
    assert PROVIDER_DEFAULTS[settings.provider].api_key_env == key_var


def test_orga_api_key_wins_over_the_conventional_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """ORGA_API_KEY is tried first."""
    monkeypatch.setenv("ORGA_PROVIDER", "openai")
    monkeypatch.setenv("ORGA_API_KEY", "sk-orga")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    assert ProviderSettings().resolved_api_key() == SecretStr("sk-orga")


def test_another_providers_key_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """An ANTHROPIC_API_KEY does not configure the openai provider; a blank key is unset."""
    monkeypatch.setenv("ORGA_PROVIDER", "openai")
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("ORGA_API_KEY", "   ")
    assert ProviderSettings().resolved_api_key() is None


def test_keys_never_appear_in_the_settings_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every key field is a SecretStr."""
    monkeypatch.setenv("ORGA_API_KEY", KEY)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    settings = ProviderSettings()
    assert KEY not in repr(settings)
    assert KEY not in str(settings.model_dump())


def test_an_unknown_provider_is_rejected_with_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    """ORGA_PROVIDER=bedrock names the allowed values."""
    monkeypatch.setenv("ORGA_PROVIDER", "bedrock")
    with pytest.raises(ValidationError, match="'scripted', 'openai', 'openrouter' or 'anthropic'"):
        ProviderSettings()


def test_a_base_url_without_scheme_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    """A base URL must be http(s); the message says what to set."""
    monkeypatch.setenv("ORGA_BASE_URL", "api.openai.com/v1")
    with pytest.raises(
        ValidationError, match=r"must start with http:// or https://.*ORGA_BASE_URL"
    ):
        ProviderSettings()


@pytest.mark.parametrize(("name", "value"), [("ORGA_TIMEOUT_S", "0"), ("ORGA_MAX_RETRIES", "-1")])
def test_impossible_limits_are_rejected(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    """A zero timeout or negative retries fail validation."""
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError):
        ProviderSettings()


# -- factory -------------------------------------------------------------------------------


def test_the_scripted_provider_needs_a_script_path() -> None:
    """The default provider without ORGA_SCRIPT_PATH says what to set."""
    with pytest.raises(ConfigError, match="ORGA_SCRIPT_PATH"):
        build_provider(ProviderSettings())


def test_the_scripted_provider_is_built_from_the_script(monkeypatch: pytest.MonkeyPatch) -> None:
    """ORGA_SCRIPT_PATH and ORGA_SCRIPT_ON_EXHAUSTED configure the scripted provider."""
    monkeypatch.setenv("ORGA_SCRIPT_PATH", str(FIXTURES_DIR / "script_demo.yaml"))
    monkeypatch.setenv("ORGA_SCRIPT_ON_EXHAUSTED", "repeat_last")
    provider = build_provider(ProviderSettings())
    assert isinstance(provider, ScriptedProvider)
    assert [ask(provider) for _ in range(4)][-2:] == ["All tests pass.", "All tests pass."]


@pytest.mark.parametrize(
    ("provider", "variable"),
    [
        ("openai", "OPENAI_API_KEY"),
        ("openrouter", "OPENROUTER_API_KEY"),
        ("anthropic", "ANTHROPIC_API_KEY"),
    ],
)
def test_a_missing_key_names_the_variables_to_set(provider: str, variable: str) -> None:
    """A real provider without a key is a ConfigError naming ORGA_API_KEY and its own variable."""
    with pytest.raises(
        ConfigError, match=f"ORGA_PROVIDER={provider} needs an API key.*ORGA_API_KEY or {variable}"
    ):
        build_provider(ProviderSettings(provider=provider))


def test_a_keyless_local_openai_server_is_allowed() -> None:
    """On localhost (Ollama, llama.cpp) no key is needed, and none is sent."""
    with FakeOpenAIServer() as server:
        server.respond_text("local")
        provider = build_provider(ProviderSettings(provider="openai", base_url=server.base_url))
        assert ask(provider) == "local"
        assert "authorization" not in server.last_request.headers


def test_a_keyless_remote_openai_server_is_refused() -> None:
    """Away from this machine a key is required, even with a custom base URL."""
    with pytest.raises(ConfigError, match="needs an API key"):
        build_provider(ProviderSettings(provider="openai", base_url="https://vllm.example/v1"))


def test_openrouter_is_built_with_its_headers_and_name() -> None:
    """OpenRouter uses the OpenAI wire format plus HTTP-Referer and X-Title."""
    with FakeOpenAIServer(api_key=KEY) as server:
        server.respond_text("routed")
        settings = ProviderSettings(
            provider="openrouter",
            base_url=server.base_url,
            openrouter_api_key=KEY,
            openrouter_referer="https://example.org",
            openrouter_title="orga",
        )
        provider = build_provider(settings)
        assert isinstance(provider, OpenAICompatProvider)
        assert provider.provider_name() == "openrouter"
        assert provider.default_model() == "anthropic/claude-sonnet-4"
        assert ask(provider) == "routed"
        headers = server.last_request.headers
        assert (headers["http-referer"], headers["x-title"]) == ("https://example.org", "orga")
        assert server.last_request.body["model"] == "anthropic/claude-sonnet-4"


def test_plain_openai_sends_no_openrouter_headers() -> None:
    """Referer and title are OpenRouter's only."""
    with FakeOpenAIServer(api_key=KEY) as server:
        server.respond_text("ok")
        settings = ProviderSettings(
            provider="openai", base_url=server.base_url, api_key=KEY, openrouter_title="orga"
        )
        ask(build_provider(settings))
        assert "x-title" not in server.last_request.headers


def test_anthropic_is_built_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """ORGA_PROVIDER=anthropic with ANTHROPIC_API_KEY talks the Messages API."""
    with FakeAnthropicServer(api_key=KEY) as server:
        server.respond_text("claude here")
        monkeypatch.setenv("ORGA_PROVIDER", "anthropic")
        monkeypatch.setenv("ORGA_BASE_URL", server.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
        provider = build_provider(ProviderSettings())
        assert isinstance(provider, AnthropicProvider)
        assert ask(provider) == "claude here"
        assert KEY not in repr(provider)


def test_timeout_and_retries_reach_the_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a retry deadline (ORGA_PROVIDER_RETRY_DEADLINE_S=0), ORGA_MAX_RETRIES=1 means
    two attempts; the injected sleep records the one wait."""
    with FakeOpenAIServer(api_key=KEY) as server:
        for _ in range(2):
            server.respond_error(503, "busy")
        monkeypatch.setenv("ORGA_MAX_RETRIES", "1")
        monkeypatch.setenv("ORGA_PROVIDER_RETRY_DEADLINE_S", "0")
        settings = ProviderSettings(provider="openai", base_url=server.base_url, api_key=KEY)
        sleep = RecordingSleep()
        provider = build_provider(settings, sleep=sleep, rand=lambda: 0.0)
        with pytest.raises(ProviderError, match="HTTP 503"):
            ask(provider)
        assert len(server.requests) == 2
        assert sleep.delays == [0.5]


def test_the_factory_result_is_an_inference_provider(tmp_path: Path) -> None:
    """Whatever it builds satisfies the Protocol."""
    script = tmp_path / "s.json"
    script.write_text('["hello"]', encoding="utf-8")
    settings = ProviderSettings(script_path=script)
    assert isinstance(build_provider(settings), InferenceProvider)


def test_keys_handed_over_win_and_the_rest_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reasoning worker's keys come through its socket (workers.key_handoff), its other
    settings from its environment."""
    monkeypatch.setenv("ORGA_PROVIDER", "openai")
    monkeypatch.delenv("ORGA_API_KEY", raising=False)
    settings = ProviderSettings.with_keys({"ORGA_API_KEY": "sk-handed", "OTHER": "x"})
    assert settings.provider is ProviderKind.OPENAI
    resolved = settings.resolved_api_key()
    assert resolved is not None and resolved.get_secret_value() == "sk-handed"
