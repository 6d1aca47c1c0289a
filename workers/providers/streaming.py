"""Streamed model answers: Server-Sent Events read into the reply a non-streamed call returns.

A model call made inside :func:`streaming_to` asks its provider for a streamed answer (OpenAI
chat completions ``stream: true`` with ``stream_options.include_usage``; the Anthropic Messages
event stream) and hands each piece of text to the :class:`TokenSink` as it comes. The pieces
are assembled into the very JSON object the provider would have answered without streaming
(``chat.completion``, ``message``), which the provider's own parser then reads: tool calls,
finish reason and usage come out the same either way. The text deltas are only a view; the
assembled answer stays the unit of durability.

The parsing is pure: :class:`SseDecoder` turns lines into events, and one assembler per wire
format turns events into text deltas and the final object:

- OpenAI: ``data: {chat.completion.chunk}`` lines, ``delta.content`` text, ``delta.tool_calls``
  pieces merged by ``index`` (the first piece carries ``id`` and ``function.name``, the rest
  append to ``function.arguments``), ``finish_reason`` on the last choice chunk, ``usage`` on a
  chunk with no choices, then ``data: [DONE]``;
- Anthropic: ``message_start`` (the message and its input usage), ``content_block_start`` /
  ``content_block_delta`` (``text_delta``; ``input_json_delta`` whose ``partial_json`` pieces make
  a tool_use block's input) / ``content_block_stop``, ``message_delta`` (``stop_reason``, the
  output usage), ``message_stop``; ``ping`` is ignored and ``error`` raises.

A stream that ends before its end marker is a broken connection (``aiohttp.ClientPayloadError``,
retried like one); when a retried call had already streamed text, the sink hears
``stream_restarted`` before the new answer's first piece, so a watcher never joins two answers.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import aiohttp

from workers.providers._http import json_error_message, shown
from workers.providers.base import ProviderError, ResponseParseError

__all__ = [
    "AnthropicStreamAssembler",
    "OpenAIStreamAssembler",
    "SseDecoder",
    "SseEvent",
    "StreamAssembler",
    "StreamReader",
    "TokenKind",
    "TokenSink",
    "current_sink",
    "sse_events",
    "streaming_to",
]

TokenKind = Literal["token", "stream_restarted", "stream_done"]
"""What a sink hears: a piece of text, "forget the text so far, the answer starts again",
and "the answer is whole"."""


class TokenSink(Protocol):
    """Where the text of a streamed answer goes as it comes (the worker's: a Redis stream)."""

    async def emit(self, kind: TokenKind, text: str = "") -> None:
        """One piece of the answer (``token``), a restart, or its end."""
        ...


_sink: contextvars.ContextVar[TokenSink | None] = contextvars.ContextVar(
    "orga_token_sink", default=None
)


@contextmanager
def streaming_to(sink: TokenSink) -> Iterator[None]:
    """Model calls made inside stream their answer into ``sink``."""
    token = _sink.set(sink)
    try:
        yield
    finally:
        _sink.reset(token)


def current_sink() -> TokenSink | None:
    """The sink of the model calls made here, or None: then they are not streamed."""
    return _sink.get()


# -- Server-Sent Events ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One event: its ``event:`` name (``message`` when none is given) and its ``data``."""

    event: str
    data: str


@dataclass(slots=True)
class SseDecoder:
    """The SSE line protocol (WHATWG HTML §9.2.6): fields until a blank line ends an event.

    ``data:`` lines are joined by newlines; one leading space after the colon is dropped;
    comment lines (``:``) and ``id:`` / ``retry:`` are ignored; an event without data is not
    dispatched.
    """

    _event: str = ""
    _data: list[str] = field(default_factory=list)

    def feed(self, line: str) -> SseEvent | None:
        """The event a blank ``line`` completes, else None."""
        line = line.rstrip("\r\n")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def flush(self) -> SseEvent | None:
        """An event left without its blank line when the stream ended."""
        return self._dispatch()

    def _dispatch(self) -> SseEvent | None:
        event, data = self._event or "message", self._data
        self._event, self._data = "", []
        return SseEvent(event, "\n".join(data)) if data else None


def sse_events(lines: list[str]) -> list[SseEvent]:
    """Every event of a whole recorded stream (tests, recorded payloads)."""
    decoder = SseDecoder()
    events = [e for e in map(decoder.feed, lines) if e is not None]
    last = decoder.flush()
    return [*events, last] if last is not None else events


def _json_data(event: SseEvent, provider: str) -> dict[str, Any]:
    try:
        data = json.loads(event.data)
    except ValueError:
        raise ResponseParseError(
            f"{provider} streamed an event whose data is not JSON: {shown(event.data)}"
        ) from None
    if not isinstance(data, dict):
        raise ResponseParseError(f"{provider} streamed a JSON {type(data).__name__}: {shown(data)}")
    return data


# -- assemblers -----------------------------------------------------------------------------


class StreamAssembler(Protocol):
    """Reads one wire format's events: the text each adds, then the whole answer."""

    finished: bool

    def feed(self, event: SseEvent) -> str:
        """Take one event; the answer's text it adds ('' for none)."""
        ...

    def result(self) -> dict[str, Any]:
        """The answer as the non-streamed reply's JSON object."""
        ...


@dataclass(slots=True)
class _OpenAIToolCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass(slots=True)
class OpenAIStreamAssembler:
    """``chat.completion.chunk`` events into a ``chat.completion`` object."""

    provider: str = "openai"
    finished: bool = False
    _head: dict[str, Any] = field(default_factory=dict)
    _text: list[str] = field(default_factory=list)
    _refusal: list[str] = field(default_factory=list)
    _calls: dict[int, _OpenAIToolCall] = field(default_factory=dict)
    _finish_reason: str | None = None
    _usage: dict[str, Any] | None = None

    def feed(self, event: SseEvent) -> str:
        """A chunk's content delta; ``[DONE]`` finishes."""
        if event.data.strip() == "[DONE]":
            self.finished = True
            return ""
        chunk = _json_data(event, self.provider)
        if "error" in chunk and "choices" not in chunk:
            raise ProviderError(
                f"{self.provider} answered an error in its stream: {json_error_message(chunk)}"
            )
        for key in ("id", "model", "created", "system_fingerprint"):
            if key in chunk and key not in self._head:
                self._head[key] = chunk[key]
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return ""
        choice = choices[0]
        if isinstance(choice.get("finish_reason"), str):
            self._finish_reason = choice["finish_reason"]
        delta = choice.get("delta")
        return self._delta(delta) if isinstance(delta, dict) else ""

    def _delta(self, delta: dict[str, Any]) -> str:
        text = delta.get("content")
        if isinstance(delta.get("refusal"), str):
            self._refusal.append(delta["refusal"])
        for piece in delta.get("tool_calls") or ():
            self._tool_call_piece(piece)
        if isinstance(text, str) and text:
            self._text.append(text)
            return text
        return ""

    def _tool_call_piece(self, piece: Any) -> None:
        if not isinstance(piece, dict) or not isinstance(piece.get("index"), int):
            raise ResponseParseError(
                f"{self.provider} streamed a tool_calls delta without an index: {shown(piece)}"
            )
        call = self._calls.setdefault(piece["index"], _OpenAIToolCall())
        call.id = call.id or str(piece.get("id") or "")
        function = piece.get("function")
        if isinstance(function, dict):
            call.name = call.name or str(function.get("name") or "")
            if isinstance(function.get("arguments"), str):
                call.arguments.append(function["arguments"])

    def result(self) -> dict[str, Any]:
        """The ``chat.completion`` these chunks make."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self._text) or None,
            "refusal": "".join(self._refusal) or None,
        }
        if self._calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": "".join(call.arguments)},
                }
                for _, call in sorted(self._calls.items())
            ]
        choice = {"index": 0, "message": message, "finish_reason": self._finish_reason}
        completion = {**self._head, "object": "chat.completion", "choices": [choice]}
        if self._usage is not None:
            completion["usage"] = self._usage
        return completion


@dataclass(slots=True)
class AnthropicStreamAssembler:
    """Messages API stream events into a ``message`` object."""

    finished: bool = False
    _message: dict[str, Any] = field(default_factory=dict)
    _blocks: dict[int, dict[str, Any]] = field(default_factory=dict)
    _partial_json: dict[int, list[str]] = field(default_factory=dict)

    def feed(self, event: SseEvent) -> str:
        """One event's text delta ('' for the others); ``message_stop`` finishes."""
        data = _json_data(event, "anthropic")
        kind = data.get("type", event.event)
        if kind == "error":
            raise ProviderError(
                f"anthropic answered an error in its stream: {json_error_message(data)}"
            )
        handler = _ANTHROPIC_EVENTS.get(str(kind))
        return handler(self, data) if handler is not None else ""

    def _start(self, data: dict[str, Any]) -> str:
        message = data.get("message")
        if not isinstance(message, dict):
            raise ResponseParseError(f"anthropic message_start without a message: {shown(data)}")
        self._message = {**message, "usage": dict(message.get("usage") or {})}
        return ""

    def _block_start(self, data: dict[str, Any]) -> str:
        block = data.get("content_block")
        if not isinstance(block, dict):
            raise ResponseParseError(
                f"anthropic content_block_start without a block: {shown(data)}"
            )
        self._blocks[_index(data)] = dict(block)
        return str(block.get("text") or "") if block.get("type") == "text" else ""

    def _block_delta(self, data: dict[str, Any]) -> str:
        index, delta = _index(data), data.get("delta")
        block = self._blocks.get(index)
        if block is None or not isinstance(delta, dict):
            raise ResponseParseError(
                f"anthropic content_block_delta for no started block: {shown(data)}"
            )
        if delta.get("type") == "text_delta":
            text = str(delta.get("text") or "")
            block["text"] = str(block.get("text") or "") + text
            return text
        if delta.get("type") == "input_json_delta":
            self._partial_json.setdefault(index, []).append(str(delta.get("partial_json") or ""))
        return ""

    def _block_stop(self, data: dict[str, Any]) -> str:
        index = _index(data)
        pieces = self._partial_json.pop(index, None)
        block = self._blocks.get(index)
        if block is not None and pieces is not None and "".join(pieces).strip():
            try:
                block["input"] = json.loads("".join(pieces))
            except ValueError:
                raise ResponseParseError(
                    f"anthropic streamed tool_use input that is not JSON: {shown(''.join(pieces))}"
                ) from None
        return ""

    def _message_delta(self, data: dict[str, Any]) -> str:
        delta = data.get("delta")
        if isinstance(delta, dict):
            self._message.update({k: v for k, v in delta.items() if k.startswith("stop_")})
        usage = data.get("usage")
        if isinstance(usage, dict):
            self._message.setdefault("usage", {}).update(
                {k: v for k, v in usage.items() if v is not None}
            )
        return ""

    def _stop(self, data: dict[str, Any]) -> str:
        self.finished = True
        return ""

    def result(self) -> dict[str, Any]:
        """The ``message`` these events make."""
        content = [block for _, block in sorted(self._blocks.items())]
        return {**self._message, "type": "message", "content": content}


def _index(data: dict[str, Any]) -> int:
    index = data.get("index")
    if not isinstance(index, int):
        raise ResponseParseError(
            f"anthropic streamed a block event without an index: {shown(data)}"
        )
    return index


_ANTHROPIC_EVENTS: dict[str, Callable[[AnthropicStreamAssembler, dict[str, Any]], str]] = {
    "message_start": AnthropicStreamAssembler._start,
    "content_block_start": AnthropicStreamAssembler._block_start,
    "content_block_delta": AnthropicStreamAssembler._block_delta,
    "content_block_stop": AnthropicStreamAssembler._block_stop,
    "message_delta": AnthropicStreamAssembler._message_delta,
    "message_stop": AnthropicStreamAssembler._stop,
}


# -- reading a live stream ------------------------------------------------------------------


class StreamReader:
    """Reads one call's streamed answer (each try of it) into its reply object, telling the
    sink each piece; a try after one that streamed text starts with ``stream_restarted``."""

    def __init__(
        self,
        assembler: Callable[[], StreamAssembler],
        sink: TokenSink,
        redact: Callable[[str], str],
    ) -> None:
        self._assembler = assembler
        self._sink = sink
        self._redact = redact
        self._streamed = False

    async def __call__(self, lines: AsyncIterator[str]) -> dict[str, Any]:
        """The reply object of one try's stream."""
        if self._streamed:
            await self._sink.emit("stream_restarted")
            self._streamed = False
        assembler, decoder = self._assembler(), SseDecoder()
        async for line in lines:
            event = decoder.feed(line)
            if event is not None and await self._take(assembler, event):
                break
        else:
            last = decoder.flush()
            if last is None or not await self._take(assembler, last):
                raise aiohttp.ClientPayloadError("the model's stream ended before its end marker")
        await self._sink.emit("stream_done")
        return assembler.result()

    async def _take(self, assembler: StreamAssembler, event: SseEvent) -> bool:
        """Feed one event; whether the answer is finished. An error the provider sent in
        its stream is redacted (``redact``: the endpoint's), as one in a whole answer is."""
        try:
            text = assembler.feed(event)
        except ProviderError as exc:
            raise ProviderError(self._redact(str(exc))) from None
        if text:
            self._streamed = True
            await self._sink.emit("token", text)
        return assembler.finished
