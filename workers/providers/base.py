"""The inference provider seam and its error tree (Symbiont's ``InferenceProvider``).

InferenceError
 +-- ProviderError           non-2xx answer or transport failure
 +-- RateLimitedError        429 after the retries; carries retry_after_s
 +-- ContextOverflowError    the prompt does not fit the model's window
 +-- ModelUnavailableError   the model is unknown or not served (also a ConfigError)
 +-- InvalidRequestError     4xx: the request itself is wrong (the message says what)
 |    +-- AuthenticationError  401/403: the key was rejected (also a ConfigError)
 +-- InferenceTimeoutError   no answer within the timeout
 +-- ResponseParseError      the reply is not the wire format it should be

The errors that are also :class:`~shared.errors.ConfigError` are the deployment's fault, not the
moment's: the worker reports them as ``error_kind: config`` and the coordinator fails the task
at once instead of trying again; so is :class:`BaseUrlError` (the base URL cannot be used),
raised when the provider is built or called.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from shared.conversation import Conversation
from shared.errors import ConfigError, OrgaError
from shared.inference import InferenceOptions, InferenceResponse

__all__ = [
    "AuthenticationError",
    "BaseUrlError",
    "ContextOverflowError",
    "InferenceError",
    "InferenceProvider",
    "InferenceTimeoutError",
    "InvalidRequestError",
    "ModelUnavailableError",
    "ProviderError",
    "RateLimitedError",
    "ResponseParseError",
]


class BaseUrlError(ConfigError):
    """The provider's base URL cannot be used (a bad port, an open ``[``, no host)."""


class InferenceError(OrgaError):
    """An inference call failed."""


class ProviderError(InferenceError):
    """The provider answered with an error status or could not be reached."""


class RateLimitedError(InferenceError):
    """The provider kept answering 429."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ContextOverflowError(InferenceError):
    """The conversation is larger than the model's context window."""


class ModelUnavailableError(InferenceError, ConfigError):
    """The model is not available from this provider (a configuration error)."""


class InvalidRequestError(InferenceError):
    """The provider rejected the request as invalid (a 4xx other than 429)."""


class AuthenticationError(InvalidRequestError, ConfigError):
    """The provider rejected the API key (HTTP 401 or 403): a configuration error."""


class InferenceTimeoutError(InferenceError):
    """No answer within the timeout."""


class ResponseParseError(InferenceError):
    """The provider's reply does not follow its wire format."""


@runtime_checkable
class InferenceProvider(Protocol):
    """Completes a conversation: text, tool calls, usage and a finish reason."""

    async def complete(
        self, conversation: Conversation, options: InferenceOptions
    ) -> InferenceResponse:
        """One model call."""
        ...

    def provider_name(self) -> str:
        """``openai``, ``anthropic``, ``scripted``, ``function``..."""
        ...

    def default_model(self) -> str:
        """The model used when the options name none."""
        ...
