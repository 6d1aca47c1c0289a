"""Provider configuration, read once from the environment at the process edge.

================================  ==============================================================
``ORGA_PROVIDER``                 ``scripted`` (default), ``openai``, ``openrouter``, ``anthropic``
``ORGA_BASE_URL``                 default per provider (see ``PROVIDER_DEFAULTS``)
``ORGA_MODEL``                    default per provider
``ORGA_API_KEY``                  else ``OPENAI_API_KEY`` / ``OPENROUTER_API_KEY`` /
                                  ``ANTHROPIC_API_KEY``, the one of the chosen provider
``ORGA_TIMEOUT_S``                120
``ORGA_MAX_RETRIES``              3 (429 and 5xx)
``ORGA_RETRY_AFTER_CAP_S``        60 (the longest ``Retry-After`` honoured)
``ORGA_PROVIDER_RETRY_DEADLINE_S``  300: 429, 5xx, timeouts are retried (Retry-After honoured)
                                  until this long after a call's first try, without failing
                                  the step's attempt; 0: ``ORGA_MAX_RETRIES`` tries instead
``ORGA_SCRIPT_PATH``              the YAML/JSON script of the scripted provider
``ORGA_SCRIPT_ON_EXHAUSTED``      ``final_answer`` (default), ``repeat_last``, ``raise``
``ORGA_OPENROUTER_REFERER``       sent as ``HTTP-Referer`` to OpenRouter
``ORGA_OPENROUTER_TITLE``         sent as ``X-Title`` to OpenRouter
================================  ==============================================================

Keys are ``SecretStr``: they never appear in ``repr``, logs or error messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.redaction import redact_url
from workers.providers.anthropic import ANTHROPIC_BASE_URL, ANTHROPIC_DEFAULT_MODEL
from workers.providers.openai_compat import OPENAI_BASE_URL, OPENAI_DEFAULT_MODEL
from workers.providers.scripted import OnExhausted

__all__ = ["PROVIDER_DEFAULTS", "ProviderDefaults", "ProviderKind", "ProviderSettings"]


class ProviderKind(StrEnum):
    """The providers ``ORGA_PROVIDER`` can name."""

    SCRIPTED = "scripted"
    OPENAI = "openai"
    OPENROUTER = "openrouter"
    ANTHROPIC = "anthropic"


@dataclass(frozen=True, slots=True)
class ProviderDefaults:
    """What a provider uses when the settings leave a value out."""

    base_url: str
    model: str
    api_key_env: str


PROVIDER_DEFAULTS = MappingProxyType(
    {
        ProviderKind.OPENAI: ProviderDefaults(
            OPENAI_BASE_URL, OPENAI_DEFAULT_MODEL, "OPENAI_API_KEY"
        ),
        ProviderKind.OPENROUTER: ProviderDefaults(
            "https://openrouter.ai/api/v1", "anthropic/claude-sonnet-4", "OPENROUTER_API_KEY"
        ),
        ProviderKind.ANTHROPIC: ProviderDefaults(
            ANTHROPIC_BASE_URL, ANTHROPIC_DEFAULT_MODEL, "ANTHROPIC_API_KEY"
        ),
    }
)
"""Base URL, model and conventional key variable of each HTTP provider."""


_KEY_FIELDS = MappingProxyType(
    {
        "ORGA_API_KEY": "api_key",
        "OPENAI_API_KEY": "openai_api_key",
        "OPENROUTER_API_KEY": "openrouter_api_key",
        "ANTHROPIC_API_KEY": "anthropic_api_key",
    }
)
"""The key variables and the field each sets."""


class ProviderSettings(BaseSettings):
    """Which provider to use and how to reach it (``ORGA_*`` environment variables)."""

    model_config = SettingsConfigDict(
        env_prefix="ORGA_", frozen=True, extra="forbid", populate_by_name=True
    )

    provider: ProviderKind = ProviderKind.SCRIPTED
    base_url: str | None = None
    model: str | None = None
    api_key: SecretStr | None = None
    timeout_s: float = Field(default=120.0, gt=0)
    max_retries: int = Field(default=3, ge=0)
    retry_after_cap_s: float = Field(default=60.0, ge=0)
    provider_retry_deadline_s: float = Field(default=300.0, ge=0)
    script_path: Path | None = None
    script_on_exhausted: OnExhausted = OnExhausted.FINAL_ANSWER
    openrouter_referer: str | None = None
    openrouter_title: str | None = None
    openai_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("openai_api_key", "OPENAI_API_KEY")
    )
    openrouter_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("openrouter_api_key", "OPENROUTER_API_KEY")
    )
    anthropic_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("anthropic_api_key", "ANTHROPIC_API_KEY")
    )

    @classmethod
    def with_keys(cls, keys: Mapping[str, str]) -> ProviderSettings:
        """The settings from the environment, with the keys handed over in ``keys`` (variable
        name → key, :mod:`workers.key_handoff`) instead of the environment's."""
        handed = {_KEY_FIELDS[n]: SecretStr(v) for n, v in keys.items() if n in _KEY_FIELDS}
        return cls().model_copy(update=handed)

    @field_validator("provider", mode="before")
    @classmethod
    def _lowercase_provider(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        cleaned = value.strip().rstrip("/")
        if not cleaned.startswith(("http://", "https://")):
            raise ValueError(
                f"base_url must start with http:// or https://, got {redact_url(cleaned)!r}; "
                "set ORGA_BASE_URL to e.g. https://api.openai.com/v1"
            )
        return cleaned

    @field_validator(
        "model", "openrouter_referer", "openrouter_title", "script_path", mode="before"
    )
    @classmethod
    def _blank_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    def defaults(self) -> ProviderDefaults | None:
        """The chosen provider's defaults (None for ``scripted``)."""
        return PROVIDER_DEFAULTS.get(self.provider)

    def resolved_base_url(self) -> str | None:
        """``base_url``, else the provider's default."""
        defaults = self.defaults()
        return self.base_url or (defaults.base_url if defaults else None)

    def resolved_model(self) -> str | None:
        """``model``, else the provider's default."""
        defaults = self.defaults()
        return self.model or (defaults.model if defaults else None)

    def api_key_env_names(self) -> tuple[str, ...]:
        """The variables that may hold the key, in the order they are tried."""
        defaults = self.defaults()
        return ("ORGA_API_KEY", defaults.api_key_env) if defaults else ("ORGA_API_KEY",)

    def resolved_api_key(self) -> SecretStr | None:
        """``ORGA_API_KEY``, else the chosen provider's conventional variable; blank is unset."""
        conventional = {
            ProviderKind.OPENAI: self.openai_api_key,
            ProviderKind.OPENROUTER: self.openrouter_api_key,
            ProviderKind.ANTHROPIC: self.anthropic_api_key,
        }.get(self.provider)
        for candidate in (self.api_key, conventional):
            if candidate is not None and candidate.get_secret_value().strip():
                return SecretStr(candidate.get_secret_value().strip())
        return None
