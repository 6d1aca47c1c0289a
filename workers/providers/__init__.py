"""Inference providers: OpenAI-compatible, Anthropic, scripted and function providers.

``build_provider(ProviderSettings())`` gives the provider the environment configures; the
classes can also be built directly. Every provider implements ``InferenceProvider``.
"""

from workers.providers.anthropic import AnthropicProvider
from workers.providers.base import (
    AuthenticationError,
    BaseUrlError,
    ContextOverflowError,
    InferenceError,
    InferenceProvider,
    InferenceTimeoutError,
    InvalidRequestError,
    ModelUnavailableError,
    ProviderError,
    RateLimitedError,
    ResponseParseError,
)
from workers.providers.factory import build_provider
from workers.providers.function import FunctionProvider, ProviderFunction, ProviderReply
from workers.providers.openai_compat import OpenAICompatProvider
from workers.providers.retry import RetryPolicy, SleepFn, parse_retry_after
from workers.providers.scripted import (
    SCRIPT_EXHAUSTED_TEXT,
    OnExhausted,
    Script,
    ScriptedProvider,
    ScriptedReply,
    ScriptedRequest,
    ScriptedToolCall,
    ScriptError,
    ScriptExhaustedError,
    load_script,
)
from workers.providers.settings import PROVIDER_DEFAULTS, ProviderKind, ProviderSettings

__all__ = [
    "PROVIDER_DEFAULTS",
    "SCRIPT_EXHAUSTED_TEXT",
    "AnthropicProvider",
    "AuthenticationError",
    "BaseUrlError",
    "ContextOverflowError",
    "FunctionProvider",
    "InferenceError",
    "InferenceProvider",
    "InferenceTimeoutError",
    "InvalidRequestError",
    "ModelUnavailableError",
    "OnExhausted",
    "OpenAICompatProvider",
    "ProviderError",
    "ProviderFunction",
    "ProviderKind",
    "ProviderReply",
    "ProviderSettings",
    "RateLimitedError",
    "ResponseParseError",
    "RetryPolicy",
    "Script",
    "ScriptError",
    "ScriptExhaustedError",
    "ScriptedProvider",
    "ScriptedReply",
    "ScriptedRequest",
    "ScriptedToolCall",
    "SleepFn",
    "build_provider",
    "load_script",
    "parse_retry_after",
]
