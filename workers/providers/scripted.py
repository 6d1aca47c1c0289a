"""A provider that replays a script of replies: the default for demos, examples and tests.

A script file (YAML, or JSON when it ends in ``.json``) is a list of replies::

    - text: "I will look at the README first."
      tool_calls:
        - name: file_read
          arguments: {path: README.md}
    - tool_calls: [{name: run_command, arguments: {command: "pytest -q"}}]
      usage: {prompt_tokens: 120, completion_tokens: 30, total_tokens: 150}
    - text: "All tests pass."          # a plain string is short for {text: ...}
      finish_reason: stop

or a mapping ``{replies: [...], on_exhausted: final_answer | repeat_last | raise}``.

Tool-call ids are ``call_1``, ``call_2``... counted over the provider's life (unique across
replies) unless the script sets ``id``. Without ``usage`` a reply reports Symbiont's token
estimate of the conversation (prompt) and of the reply (completion), so token limits behave
in demos. Without ``finish_reason`` it is ``tool_calls`` when the reply has tool calls, else
``stop``.

When the replies run out the provider, by default (``final_answer``), answers the text
``Script exhausted`` with no tool calls, which ends a reasoning loop cleanly; ``repeat_last``
replays the last reply; ``raise`` raises ``ScriptExhaustedError``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from shared.conversation import Conversation, ConversationMessage, estimate_message_tokens
from shared.errors import ConfigError
from shared.inference import FinishReason, InferenceOptions, InferenceResponse, ToolCall, Usage
from workers.providers.base import InferenceError

__all__ = [
    "SCRIPT_EXHAUSTED_TEXT",
    "OnExhausted",
    "Script",
    "ScriptError",
    "ScriptExhaustedError",
    "ScriptedProvider",
    "ScriptedReply",
    "ScriptedRequest",
    "ScriptedToolCall",
    "load_script",
    "parse_script",
]

SCRIPT_EXHAUSTED_TEXT = "Script exhausted"


class ScriptError(ConfigError):
    """A script of replies cannot be read or is malformed (the message names the reply)."""


class ScriptExhaustedError(InferenceError):
    """The script has no reply left and ``on_exhausted`` is ``raise``."""


class OnExhausted(StrEnum):
    """What the scripted provider does once every reply was used."""

    FINAL_ANSWER = "final_answer"
    REPEAT_LAST = "repeat_last"
    RAISE = "raise"


class ScriptedToolCall(BaseModel):
    """A tool call in a script: a name and arguments as a mapping (an id is optional)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str | None = Field(default=None, min_length=1)


class ScriptedReply(BaseModel):
    """One scripted model reply: text, tool calls, or both."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str = ""
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    usage: Usage | None = None
    finish_reason: FinishReason | None = None

    @model_validator(mode="after")
    def _says_something(self) -> ScriptedReply:
        if "text" not in self.model_fields_set and not self.tool_calls:
            raise ValueError("a reply needs `text` or `tool_calls` (use text: '' for an empty one)")
        return self


def _text_shorthand(value: Any) -> Any:
    return {"text": value} if isinstance(value, str) else value


class Script(BaseModel):
    """A list of replies and what to do when they run out (None: the provider's choice)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    replies: list[Annotated[ScriptedReply, BeforeValidator(_text_shorthand)]] = Field(min_length=1)
    on_exhausted: OnExhausted | None = None


@dataclass(frozen=True, slots=True)
class ScriptedRequest:
    """What the provider was asked: a snapshot of the conversation and the options."""

    conversation: Conversation
    options: InferenceOptions


# -- loading --------------------------------------------------------------------------------


def load_script(path: Path | str) -> Script:
    """Read and validate a YAML or JSON script; ``ScriptError`` names the file and the reply."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScriptError(
            f"cannot read the script {str(source)!r}: {exc.strerror or exc}; "
            "point ORGA_SCRIPT_PATH at a YAML or JSON list of replies"
        ) from None
    return parse_script(_decode(source, text), source=str(source))


def _decode(source: Path, text: str) -> Any:
    try:
        if source.suffix.lower() == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ScriptError(f"the script {str(source)!r} is not valid YAML/JSON: {exc}") from None


def parse_script(raw: Any, *, source: str = "script") -> Script:
    """Validate decoded data: a list of replies or ``{replies, on_exhausted}``."""
    if isinstance(raw, Script):
        return raw
    if isinstance(raw, list | tuple):
        raw = {"replies": list(raw)}
    if not isinstance(raw, dict):
        raise ScriptError(
            f"{source}: a script is a list of replies (or a mapping with `replies`), "
            f"got {type(raw).__name__}: {raw!r:.200}"
        )
    try:
        return Script.model_validate(raw)
    except ValidationError as exc:
        raise ScriptError(f"{source}: malformed script: {_describe(exc)}") from None


def _describe(exc: ValidationError) -> str:
    return "; ".join(_describe_one(error) for error in exc.errors())


def _describe_one(error: Mapping[str, Any]) -> str:
    loc = list(error["loc"])
    where = "script"
    if len(loc) >= 2 and loc[0] == "replies" and isinstance(loc[1], int):
        where, loc = f"reply {loc[1]}", loc[2:]
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] != "missing":
        message += f" (got {error['input']!r:.120})"
    return f"{where}: {path}: {message}" if path else f"{where}: {message}"


# -- provider -------------------------------------------------------------------------------


class ScriptedProvider:
    """Replays scripted replies in order; see the module docstring for the script format."""

    def __init__(
        self,
        script: Script | Sequence[ScriptedReply | Mapping[str, Any] | str],
        *,
        on_exhausted: OnExhausted | str | None = None,
        model: str = "scripted",
    ) -> None:
        self._script = parse_script(script, source="replies")
        chosen = on_exhausted or self._script.on_exhausted or OnExhausted.FINAL_ANSWER
        self._on_exhausted = OnExhausted(chosen)
        self._model = model
        self._next_index = 0
        self._next_call_number = 1
        self._requests: list[ScriptedRequest] = []

    @classmethod
    def from_replies(
        cls,
        replies: Sequence[ScriptedReply | Mapping[str, Any] | str],
        *,
        on_exhausted: OnExhausted | str | None = None,
        model: str = "scripted",
    ) -> ScriptedProvider:
        """Replies given in code: ``ScriptedReply``, dicts in the file format, or plain text."""
        return cls(replies, on_exhausted=on_exhausted, model=model)

    @classmethod
    def from_file(
        cls,
        path: Path | str,
        *,
        on_exhausted: OnExhausted | str | None = None,
        model: str = "scripted",
    ) -> ScriptedProvider:
        """Replies from a YAML or JSON script file."""
        return cls(load_script(path), on_exhausted=on_exhausted, model=model)

    def __repr__(self) -> str:
        return (
            f"ScriptedProvider(replies={len(self._script.replies)}, used={self._next_index}, "
            f"on_exhausted={self._on_exhausted.value!r})"
        )

    @property
    def requests(self) -> list[ScriptedRequest]:
        """Every request received so far, oldest first (a copy)."""
        return list(self._requests)

    @property
    def remaining(self) -> int:
        """How many scripted replies have not been used yet."""
        return len(self._script.replies) - self._next_index

    def reset(self) -> None:
        """Start the script again: first reply, ``call_1``, no recorded requests."""
        self._next_index = 0
        self._next_call_number = 1
        self._requests.clear()

    def seek(self, position: int) -> None:
        """Continue as if ``position`` replies had been used already.

        A distributed run builds a fresh provider for every reasoning call; the coordinator
        passes how many model calls the task has made, so each call gets the next reply and
        the generated call ids stay unique.
        """
        replies = self._script.replies
        used = replies[: max(position, 0)]
        self._next_index = min(max(position, 0), len(replies))
        self._next_call_number = 1 + sum(
            1 for reply in used for call in reply.tool_calls if call.id is None
        )

    def provider_name(self) -> str:
        """Always ``scripted``."""
        return "scripted"

    def default_model(self) -> str:
        """The model name reported in responses when the options name none."""
        return self._model

    async def complete(
        self, conversation: Conversation, options: InferenceOptions
    ) -> InferenceResponse:
        """The next scripted reply (or the exhaustion behaviour)."""
        # Messages are immutable: a new list is enough to record what the model was sent.
        snapshot = Conversation(messages=list(conversation.messages))
        self._requests.append(ScriptedRequest(snapshot, options))
        reply = self._next_reply()
        return self._respond(reply, conversation, options.model or self._model)

    def _next_reply(self) -> ScriptedReply:
        replies = self._script.replies
        if self._next_index < len(replies):
            self._next_index += 1
            return replies[self._next_index - 1]
        if self._on_exhausted is OnExhausted.REPEAT_LAST:
            return replies[-1]
        if self._on_exhausted is OnExhausted.RAISE:
            raise ScriptExhaustedError(
                f"the script has no reply left: all {len(replies)} replies were used and call "
                f"{len(self._requests)} asked for another; add replies, or set on_exhausted to "
                "final_answer or repeat_last"
            )
        return ScriptedReply(text=SCRIPT_EXHAUSTED_TEXT)

    def _respond(
        self, reply: ScriptedReply, conversation: Conversation, model: str
    ) -> InferenceResponse:
        tool_calls = [self._tool_call(call) for call in reply.tool_calls]
        message = ConversationMessage.assistant_tool_calls(tool_calls, reply.text)
        default_finish = FinishReason.TOOL_CALLS if tool_calls else FinishReason.STOP
        return InferenceResponse(
            content=reply.text,
            tool_calls=tool_calls,
            finish_reason=reply.finish_reason or default_finish,
            usage=reply.usage or _estimated_usage(conversation, message),
            model=model,
        )

    def _tool_call(self, call: ScriptedToolCall) -> ToolCall:
        return ToolCall(
            id=call.id or self._new_call_id(), name=call.name, arguments=json.dumps(call.arguments)
        )

    def _new_call_id(self) -> str:
        call_id = f"call_{self._next_call_number}"
        self._next_call_number += 1
        return call_id


def _estimated_usage(conversation: Conversation, reply: ConversationMessage) -> Usage:
    prompt = conversation.estimate_tokens()
    completion = estimate_message_tokens(reply)
    return Usage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )
