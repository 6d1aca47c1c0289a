"""Build the configured ``InferenceProvider`` from ``ProviderSettings``.

A real provider without a key is a ``ConfigError`` naming the variables to set. The one
exception: an ``openai`` provider whose base URL is on this machine (``localhost``,
``127.0.0.0/8``, ``::1``), where Ollama, vLLM and llama.cpp usually run without a key.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
from pydantic import SecretStr

from shared.errors import ConfigError
from workers.http_pool import SessionSource
from workers.providers.anthropic import AnthropicProvider
from workers.providers.base import InferenceProvider
from workers.providers.openai_compat import OpenAICompatProvider
from workers.providers.rate_limit import ProviderThrottle
from workers.providers.retry import RetryPolicy, SleepFn
from workers.providers.scripted import ScriptedProvider
from workers.providers.settings import ProviderKind, ProviderSettings

__all__ = ["build_provider"]


def build_provider(
    settings: ProviderSettings,
    *,
    sleep: SleepFn = asyncio.sleep,
    rand: Callable[[], float] | None = None,
    session: aiohttp.ClientSession | SessionSource | None = None,
    throttle: ProviderThrottle | None = None,
) -> InferenceProvider:
    """The provider ``settings`` describe; ``sleep`` and ``rand`` are test seams.

    ``session``: the pooled ``aiohttp.ClientSession`` the provider uses and never closes (a
    worker process keeps one, :mod:`workers.http_pool`), or what gives it at each call; without
    it each call opens its own.
    ``throttle``: the rate limit shared by every worker calling this provider with this key
    (none: not shared).
    """
    if settings.provider is ProviderKind.SCRIPTED:
        return _scripted(settings)
    seams = _Seams(sleep=sleep, rand=rand, session=session, throttle=throttle)
    if settings.provider is ProviderKind.ANTHROPIC:
        return _anthropic(settings, seams)
    return _openai_compat(settings, seams)


@dataclass(frozen=True, slots=True)
class _Seams:
    """The injectable parts every HTTP provider takes."""

    sleep: SleepFn
    rand: Callable[[], float] | None
    session: aiohttp.ClientSession | SessionSource | None
    throttle: ProviderThrottle | None


def _scripted(settings: ProviderSettings) -> ScriptedProvider:
    if settings.script_path is None:
        raise ConfigError(
            "ORGA_PROVIDER=scripted needs a script of replies: set ORGA_SCRIPT_PATH to a YAML "
            "or JSON file, or set ORGA_PROVIDER to openai, openrouter or anthropic"
        )
    return ScriptedProvider.from_file(
        settings.script_path, on_exhausted=settings.script_on_exhausted
    )


def _anthropic(settings: ProviderSettings, seams: _Seams) -> AnthropicProvider:
    api_key = _require_key(settings)
    if api_key is None:
        raise _missing_key_error(settings)
    return AnthropicProvider(
        api_key=api_key,
        base_url=_base_url(settings),
        model=_model(settings),
        api_key_env=_key_env_hint(settings),
        timeout_s=settings.timeout_s,
        retry=_retry(settings),
        sleep=seams.sleep,
        rand=seams.rand,
        session=seams.session,
        throttle=seams.throttle,
    )


def _openai_compat(settings: ProviderSettings, seams: _Seams) -> OpenAICompatProvider:
    headers: dict[str, str] = {}
    if settings.provider is ProviderKind.OPENROUTER:
        if settings.openrouter_referer:
            headers["HTTP-Referer"] = settings.openrouter_referer
        if settings.openrouter_title:
            headers["X-Title"] = settings.openrouter_title
    return OpenAICompatProvider(
        base_url=_base_url(settings),
        model=_model(settings),
        api_key=_require_key(settings),
        api_key_env=_key_env_hint(settings),
        name=settings.provider.value,
        headers=headers,
        timeout_s=settings.timeout_s,
        retry=_retry(settings),
        sleep=seams.sleep,
        rand=seams.rand,
        session=seams.session,
        throttle=seams.throttle,
    )


def _require_key(settings: ProviderSettings) -> SecretStr | None:
    """The key, or None only where a keyless server is plausible; else ``ConfigError``."""
    api_key = settings.resolved_api_key()
    if api_key is not None:
        return api_key
    if settings.provider is ProviderKind.OPENAI and _is_loopback(_base_url(settings)):
        return None
    raise _missing_key_error(settings)


def _missing_key_error(settings: ProviderSettings) -> ConfigError:
    names = " or ".join(settings.api_key_env_names())
    return ConfigError(
        f"ORGA_PROVIDER={settings.provider.value} needs an API key and none is set: set {names}"
    )


def _key_env_hint(settings: ProviderSettings) -> str:
    return " or ".join(settings.api_key_env_names())


def _base_url(settings: ProviderSettings) -> str:
    url = settings.resolved_base_url()
    if url is None:  # pragma: no cover - every HTTP provider has a default
        raise ConfigError(f"no base URL for provider {settings.provider.value!r}")
    return url


def _model(settings: ProviderSettings) -> str:
    model = settings.resolved_model()
    if model is None:  # pragma: no cover - every HTTP provider has a default
        raise ConfigError(f"no model for provider {settings.provider.value!r}")
    return model


def _retry(settings: ProviderSettings) -> RetryPolicy:
    return RetryPolicy(
        max_retries=settings.max_retries,
        retry_after_cap_s=settings.retry_after_cap_s,
        deadline_s=settings.provider_retry_deadline_s,
    )


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
