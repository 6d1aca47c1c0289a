"""A whole model reply as the provider would stream it: the SSE frames of the real wire formats.

The fake model servers (``bench/fake_model_server.py``, ``tests/fakes/llm_server.py``) answer a
request with ``"stream": true`` by turning the reply they would have sent whole into these
frames, and write them one at a time with a pause between (a model's per-token latency):

- :func:`openai_frames`: ``chat.completion`` → ``data: {chat.completion.chunk}`` frames: a role
  chunk, the content in pieces of a few characters (about one token each), each tool call's
  head (``index``, ``id``, ``type``, ``function.name``, empty ``arguments``) then its arguments
  in pieces, a finish chunk, a usage chunk with empty ``choices`` when the request asked for it
  (``stream_options.include_usage``), and ``data: [DONE]``;
- :func:`anthropic_frames`: ``message`` → ``event: NAME`` / ``data: {...}`` frames:
  ``message_start`` (empty content, the input usage and ``output_tokens: 1``), a ``ping``, per
  block ``content_block_start`` / ``content_block_delta`` (``text_delta``; ``input_json_delta``
  with an empty first piece, as the API sends) / ``content_block_stop``, ``message_delta`` (the
  stop reason, the cumulative output usage) and ``message_stop``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["PIECE_CHARS", "anthropic_frames", "openai_frames", "pieces"]

PIECE_CHARS = 4
"""Characters per streamed piece: about one token of English text."""


def pieces(text: str, size: int = PIECE_CHARS) -> list[str]:
    """``text`` cut in pieces of ``size`` characters (none for '')."""
    return [text[i : i + size] for i in range(0, len(text), size)]


def _data(payload: Any) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def openai_frames(completion: Mapping[str, Any], *, include_usage: bool = True) -> list[str]:
    """The ``chat.completion.chunk`` frames of a whole ``chat.completion``."""
    head = {
        "id": completion.get("id", "chatcmpl-fake"),
        "object": "chat.completion.chunk",
        "created": completion.get("created", 0),
        "model": completion.get("model", ""),
    }
    choice = completion["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        entry = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _data({**head, "choices": [entry], "usage": None})

    frames = [chunk({"role": "assistant", "content": "", "refusal": None})]
    frames += [chunk({"content": piece}) for piece in pieces(message.get("content") or "")]
    for index, call in enumerate(message.get("tool_calls") or ()):
        function = call["function"]
        first = {"index": index, "id": call["id"], "type": "function"}
        first["function"] = {"name": function["name"], "arguments": ""}
        frames.append(chunk({"tool_calls": [first]}))
        frames += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in pieces(function.get("arguments") or "", PIECE_CHARS * 3)
        ]
    frames.append(chunk({}, choice.get("finish_reason") or "stop"))
    if include_usage and completion.get("usage") is not None:
        frames.append(_data({**head, "choices": [], "usage": completion["usage"]}))
    frames.append("data: [DONE]\n\n")
    return frames


def _event(name: str, payload: Mapping[str, Any]) -> str:
    return f"event: {name}\n{_data({'type': name, **payload})}"


def anthropic_frames(message: Mapping[str, Any]) -> list[str]:
    """The Messages API stream events of a whole ``message``."""
    usage = dict(message.get("usage") or {})
    output_tokens = usage.pop("output_tokens", 0)
    start = {k: v for k, v in message.items() if k not in ("content", "usage")}
    start.update(content=[], stop_reason=None, stop_sequence=None)
    start["usage"] = {**usage, "output_tokens": 1}
    frames = [_event("message_start", {"message": start}), _event("ping", {})]
    for index, block in enumerate(message.get("content") or ()):
        frames += _block_frames(index, block)
    stop = {"stop_reason": message.get("stop_reason"), "stop_sequence": None}
    frames.append(
        _event("message_delta", {"delta": stop, "usage": {"output_tokens": output_tokens}})
    )
    frames.append(_event("message_stop", {}))
    return frames


def _block_frames(index: int, block: Mapping[str, Any]) -> list[str]:
    if block.get("type") == "tool_use":
        opened = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        kind, key = "input_json_delta", "partial_json"
        parts = ["", *pieces(json.dumps(block.get("input") or {}), PIECE_CHARS * 3)]
    else:
        opened, kind, key = {"type": "text", "text": ""}, "text_delta", "text"
        parts = pieces(str(block.get("text") or ""))
    frames = [_event("content_block_start", {"index": index, "content_block": opened})]
    frames += [
        _event("content_block_delta", {"index": index, "delta": {"type": kind, key: part}})
        for part in parts
    ]
    frames.append(_event("content_block_stop", {"index": index}))
    return frames
