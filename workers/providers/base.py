"""The inference provider seam and its error tree (Symbiont's ``InferenceProvider``).

InferenceError
 +-- ProviderError           non-2xx answer or transport failure
 +-- RateLimitedError        429 after the retries; carries retry_after_s
 +-- ContextOverflowError    the prompt does not fit the model's window
 +-- ModelUnavailableError   the model is unknown or not served
 +-- InvalidRequestError     4xx: the request itself is wrong (the message says what)
 +-- InferenceTimeoutError   no answer within the timeout
 +-- ResponseParseError      the reply is not the wire format it should be
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from shared.conversation import Conversation
from shared.errors import OrgaError
from shared.inference import InferenceOptions, InferenceResponse

__all__ = [
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


class ModelUnavailableError(InferenceError):
    """The model is not available from this provider."""


class InvalidRequestError(InferenceError):
    """The provider rejected the request as invalid (a 4xx other than 429)."""


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
