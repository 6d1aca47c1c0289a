"""A provider backed by a plain function: the test double for anything the loop does.

The function gets the conversation and the options and returns an ``InferenceResponse``, or a
``str`` meaning a text reply with no tool calls. It may be sync or async. Like pydantic-ai's
``FunctionModel``, it lets a test decide each reply from what the model was actually sent.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from shared.conversation import Conversation
from shared.inference import InferenceOptions, InferenceResponse

__all__ = ["FunctionProvider", "ProviderFunction", "ProviderReply"]

ProviderReply = InferenceResponse | str
"""What a provider function returns: a full response, or the text of a plain reply."""

ProviderFunction = Callable[
    [Conversation, InferenceOptions], ProviderReply | Awaitable[ProviderReply]
]
"""``(conversation, options) -> InferenceResponse | str``, sync or async."""


class FunctionProvider:
    """Calls ``function`` for every completion."""

    def __init__(
        self, function: ProviderFunction, *, name: str = "function", model: str = "function"
    ) -> None:
        self._function = function
        self._name = name
        self._model = model

    def __repr__(self) -> str:
        function_name = getattr(self._function, "__qualname__", repr(self._function))
        return f"FunctionProvider({function_name}, name={self._name!r}, model={self._model!r})"

    def provider_name(self) -> str:
        """The name given at construction (``function`` by default)."""
        return self._name

    def default_model(self) -> str:
        """The model reported for text replies when the options name none."""
        return self._model

    async def complete(
        self, conversation: Conversation, options: InferenceOptions
    ) -> InferenceResponse:
        """The function's reply; a ``str`` becomes a text response."""
        result = self._function(conversation, options)
        reply = await result if inspect.isawaitable(result) else result
        if isinstance(reply, InferenceResponse):
            return reply
        if isinstance(reply, str):
            return InferenceResponse(content=reply, model=options.model or self._model)
        raise TypeError(
            f"provider function {self._function!r} returned {type(reply).__name__}; "
            "return an InferenceResponse or a str"
        )
