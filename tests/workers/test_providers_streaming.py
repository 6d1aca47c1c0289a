"""Streamed model answers: recorded wire payloads parsed, and both providers against the fake
servers speaking the streaming wire formats (text, tool calls, usage, a stream cut short)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from pydantic import SecretStr

from shared.conversation import Conversation, ConversationMessage
from shared.inference import FinishReason, InferenceOptions, InferenceResponse, ToolCall, Usage
from tests.fakes.llm_server import (
    FIXTURES_DIR,
    FakeAnthropicServer,
    FakeOpenAIServer,
    ProgrammedResponse,
    RecordingSleep,
    load_fixture,
)
from workers.http_pool import pooled_session
from workers.providers import AnthropicProvider, OpenAICompatProvider
from workers.providers._http import Endpoint, _lines
from workers.providers.anthropic import parse_anthropic_response
from workers.providers.base import (
    AuthenticationError,
    InferenceProvider,
    ProviderError,
    ResponseParseError,
)
from workers.providers.openai_compat import parse_openai_response
from workers.providers.streaming import (
    AnthropicStreamAssembler,
    OpenAIStreamAssembler,
    SseDecoder,
    SseEvent,
    StreamAssembler,
    StreamReader,
    TokenKind,
    sse_events,
    streaming_to,
)

KEY = "sk-test-stream-0123456789abcdef"


class ListSink:
    """Records what a streamed call told it."""

    def __init__(self) -> None:
        self.heard: list[tuple[TokenKind, str]] = []

    async def emit(self, kind: TokenKind, text: str = "") -> None:
        self.heard.append((kind, text))

    def text(self) -> str:
        """The text since the last restart."""
        last = max(
            (i for i, (k, _) in enumerate(self.heard) if k == "stream_restarted"), default=-1
        )
        return "".join(t for k, t in self.heard[last + 1 :] if k == "token")


def recorded(name: str) -> list[SseEvent]:
    """The events of a recorded stream in ``tests/fixtures/providers``."""
    text = (FIXTURES_DIR / name).read_text(encoding="utf-8")
    return sse_events(text.splitlines())


def assembled(assembler: StreamAssembler, events: list[SseEvent]) -> tuple[str, dict[str, Any]]:
    """The text the events streamed, and the reply they make."""
    text = "".join(assembler.feed(event) for event in events)
    assert assembler.finished
    return text, assembler.result()


# -- the pure parsing -----------------------------------------------------------------------


def test_sse_decoder_joins_data_lines_and_skips_comments() -> None:
    """Data lines join with newlines, comments and ids are skipped, a blank line dispatches."""
    decoder = SseDecoder()
    lines = [": keep-alive", "event: message_start", "id: 7", 'data: {"a":', "data:1}", ""]
    got = [decoder.feed(line) for line in lines]
    assert got[:-1] == [None] * 5
    assert got[-1] == SseEvent("message_start", '{"a":\n1}')
    assert decoder.feed("") is None  # no data, no event


async def _chunks(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def _split(*chunks: bytes) -> list[str]:
    async def collect() -> list[str]:
        return [line async for line in _lines(_chunks(*chunks))]

    return asyncio.run(collect())


@pytest.mark.parametrize(
    "chunks",
    [
        (b"data: a\n\ndata: \xc3\xa9\r\n\r\nlast",),
        (b"data: a\n", b"\ndata: \xc3", b"\xa9\r", b"\n\r", b"\nla", b"st"),
        tuple(bytes([b]) for b in b"data: a\n\ndata: \xc3\xa9\r\n\r\nlast"),
        (b"data: a\r\rdata: \xc3\xa9\r", b"\rlast"),
    ],
    ids=["whole", "cut-anywhere", "byte-by-byte", "bare-cr"],
)
def test_stream_lines_are_split_wherever_the_chunks_end(chunks: tuple[bytes, ...]) -> None:
    """``\\n``, ``\\r\\n`` and ``\\r`` end a line (SSE) even when a chunk ends between the
    two bytes of a ``\\r\\n`` or inside a UTF-8 character; the last line needs no end."""
    assert _split(*chunks) == ["data: a", "", "data: é", "", "last"]


def test_a_stream_line_has_no_length_limit() -> None:
    """A 1 MB line in 64 KB chunks is one line (aiohttp's own ``readline`` refuses one over
    512 KB in 3.14)."""
    line = b"data: " + b"x" * 1_000_000
    body = line + b"\n\n"
    chunks = [body[i : i + 65_536] for i in range(0, len(body), 65_536)]
    assert _split(*chunks) == [line.decode(), ""]


def test_openai_recorded_text_stream_parses_like_the_whole_reply() -> None:
    """A recorded text stream: its pieces in order, the content, finish reason and usage."""
    text, reply = assembled(OpenAIStreamAssembler(), recorded("openai_stream_text.sse"))
    response = parse_openai_response(reply, "gpt-4o")
    assert text == response.content == "The tests pass now."
    assert response.finish_reason is FinishReason.STOP
    assert response.usage == Usage(prompt_tokens=31, completion_tokens=5, total_tokens=36)
    assert response.model == "gpt-4o-2024-08-06"


def test_openai_recorded_tool_call_deltas_are_merged_by_index() -> None:
    """Interleaved tool_call deltas of two calls are merged by index into whole calls."""
    text, reply = assembled(OpenAIStreamAssembler(), recorded("openai_stream_tool_calls.sse"))
    response = parse_openai_response(reply, "gpt-4o")
    assert text == ""
    assert response.tool_calls == [
        ToolCall(id="call_Yx1a", name="file_read", arguments='{"path": "calc.py"}'),
        ToolCall(id="call_Zq2b", name="run_command", arguments='{"command": "pytest -q"}'),
    ]
    assert response.finish_reason is FinishReason.TOOL_CALLS
    assert response.usage.total_tokens == 164


def test_anthropic_recorded_text_stream_parses_like_the_whole_reply() -> None:
    """A recorded Messages stream: text pieces, stop reason, input + cache + output usage."""
    text, reply = assembled(AnthropicStreamAssembler(), recorded("anthropic_stream_text.sse"))
    response = parse_anthropic_response(reply, "claude")
    assert text == response.content == "Hello! How can I help?"
    assert response.finish_reason is FinishReason.STOP
    assert response.usage == Usage(
        prompt_tokens=35, completion_tokens=15, total_tokens=50, cache_read_tokens=10
    )


def test_anthropic_recorded_input_json_deltas_make_the_tool_input() -> None:
    """input_json_delta pieces are joined and parsed at content_block_stop."""
    events = recorded("anthropic_stream_tool_use.sse")
    text, reply = assembled(AnthropicStreamAssembler(), events)
    response = parse_anthropic_response(reply, "claude")
    assert text == "Okay, let's check the weather for San Francisco, CA:"
    assert response.tool_calls == [
        ToolCall(
            id="toolu_01T1x1fJ34qAmk2tNTrN7Up6",
            name="get_weather",
            arguments='{"location": "San Francisco, CA", "unit": "fahrenheit"}',
        )
    ]
    assert response.finish_reason is FinishReason.TOOL_CALLS
    assert response.usage == Usage(prompt_tokens=472, completion_tokens=89, total_tokens=561)


def test_stream_errors_name_what_is_wrong() -> None:
    """An error event raises ProviderError; a delta without an index is a parse error."""
    overloaded = SseEvent(
        "error", '{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
    )
    with pytest.raises(ProviderError, match="Overloaded"):
        AnthropicStreamAssembler().feed(overloaded)
    bad = SseEvent("message", '{"choices":[{"delta":{"tool_calls":[{"id":"x"}]}}]}')
    with pytest.raises(ResponseParseError, match="without an index"):
        OpenAIStreamAssembler().feed(bad)
    with pytest.raises(ResponseParseError, match="not JSON"):
        OpenAIStreamAssembler().feed(SseEvent("message", "{nope"))


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_an_error_in_a_stream_is_redacted(provider: str) -> None:
    """An error the provider sends inside its stream that echoes the key reaches the caller
    redacted by the endpoint, as one in an unstreamed answer does."""
    endpoint = Endpoint(provider, "http://127.0.0.1:9", "ORGA_API_KEY", SecretStr(KEY))
    error = {"type": "error", "error": {"type": "invalid", "message": f"bad key {KEY}"}}
    assembler: type[StreamAssembler] = (
        OpenAIStreamAssembler if provider == "openai" else AnthropicStreamAssembler
    )
    reader = StreamReader(assembler, ListSink(), endpoint.redact)

    async def lines() -> AsyncIterator[str]:
        yield "event: error"
        yield f"data: {json.dumps(error)}"
        yield ""

    with pytest.raises(ProviderError, match="bad key") as raised:
        asyncio.run(reader(lines()))
    assert KEY not in str(raised.value)


# -- the providers against the fake servers -------------------------------------------------


@pytest.fixture
def openai() -> Iterator[FakeOpenAIServer]:
    """A fake chat-completions server streaming one frame every 5 ms."""
    with FakeOpenAIServer(api_key=KEY, chunk_delay_s=0.005) as fake:
        yield fake
    assert not fake.errors, fake.errors


@pytest.fixture
def anthropic() -> Iterator[FakeAnthropicServer]:
    """A fake Messages server streaming one frame every 5 ms."""
    with FakeAnthropicServer(api_key=KEY, chunk_delay_s=0.005) as fake:
        yield fake
    assert not fake.errors, fake.errors


def call(provider: InferenceProvider, sink: ListSink | None) -> InferenceResponse:
    """One completion, streamed into ``sink`` (None: not streamed)."""
    conversation = Conversation(messages=[ConversationMessage.user("hello")])

    async def run() -> InferenceResponse:
        if sink is None:
            return await provider.complete(conversation, InferenceOptions())
        with streaming_to(sink):
            return await provider.complete(conversation, InferenceOptions())

    return asyncio.run(run())


def openai_provider(server: FakeOpenAIServer) -> OpenAICompatProvider:
    return OpenAICompatProvider(base_url=server.base_url, api_key=KEY, sleep=RecordingSleep())


def anthropic_provider(server: FakeAnthropicServer) -> AnthropicProvider:
    return AnthropicProvider(base_url=server.base_url, api_key=KEY, sleep=RecordingSleep())


def test_openai_streamed_text_matches_the_unstreamed_answer(openai: FakeOpenAIServer) -> None:
    """The same reply, streamed and not: the same response; the sink heard it piece by piece."""
    answer = "The fix is in calc.py: divide() now checks for zero."
    openai.respond_text(answer)
    openai.respond_text(answer)
    sink = ListSink()
    streamed = call(openai_provider(openai), sink)
    whole = call(openai_provider(openai), None)
    assert streamed == whole
    assert openai.requests[0].body["stream"] is True
    assert openai.requests[0].body["stream_options"] == {"include_usage": True}
    assert "stream" not in openai.requests[1].body
    tokens = [t for k, t in sink.heard if k == "token"]
    assert len(tokens) > 5 and "".join(tokens) == answer
    assert sink.heard[-1] == ("stream_done", "")


def test_openai_streamed_tool_calls_are_assembled(openai: FakeOpenAIServer) -> None:
    """Streamed tool calls come out whole, with the usage of the unstreamed reply."""
    calls = [("call_1", "file_read", {"path": "a.py"}), ("call_2", "file_list", {"path": "."})]
    openai.respond_tool_calls(calls, content="Looking.")
    response = call(openai_provider(openai), ListSink())
    assert response.tool_calls == [
        ToolCall(id="call_1", name="file_read", arguments='{"path": "a.py"}'),
        ToolCall(id="call_2", name="file_list", arguments='{"path": "."}'),
    ]
    assert response.content == "Looking."
    assert response.usage == Usage(prompt_tokens=20, completion_tokens=10, total_tokens=30)


def test_anthropic_streamed_text_and_tool_use(anthropic: FakeAnthropicServer) -> None:
    """Messages stream: text and a tool_use block, the same response as unstreamed."""
    anthropic.respond_tool_use([("toolu_1", "file_read", {"path": "a.py"})], text="Reading.")
    anthropic.respond_tool_use([("toolu_1", "file_read", {"path": "a.py"})], text="Reading.")
    sink = ListSink()
    streamed = call(anthropic_provider(anthropic), sink)
    assert streamed == call(anthropic_provider(anthropic), None)
    assert streamed.tool_calls == [
        ToolCall(id="toolu_1", name="file_read", arguments='{"path": "a.py"}')
    ]
    assert sink.text() == "Reading."
    assert anthropic.requests[0].body["stream"] is True


def test_a_stream_cut_short_is_retried_and_restarts_the_watchers(
    anthropic: FakeAnthropicServer,
) -> None:
    """The server dies mid-answer: the call is retried, the sink hears stream_restarted, and
    the text after it is the one whole answer."""
    reply = load_fixture("anthropic_text.json")
    anthropic.enqueue(ProgrammedResponse(200, reply, cut_after=5), ProgrammedResponse(200, reply))
    sink = ListSink()
    response = call(anthropic_provider(anthropic), sink)
    answer = reply["content"][0]["text"]
    assert response.content == answer
    kinds = [k for k, _ in sink.heard]
    assert kinds.count("stream_restarted") == 1 and kinds[-1] == "stream_done"
    assert kinds.index("stream_restarted") > kinds.index("token")
    assert sink.text() == answer
    assert len(anthropic.requests) == 2


def test_a_server_that_ignores_stream_answers_whole(openai: FakeOpenAIServer) -> None:
    """A JSON body to a streamed request is read as a whole reply, without tokens."""
    reply = load_fixture("openai_text.json")
    openai.enqueue(ProgrammedResponse(200, json.dumps(reply).encode()))
    sink = ListSink()
    response = call(openai_provider(openai), sink)
    assert response == parse_openai_response(reply, "gpt-4o")
    assert sink.heard == []


def test_a_server_that_refuses_streaming_is_asked_for_a_whole_answer(
    openai: FakeOpenAIServer,
) -> None:
    """A 400 to the streamed request (a compatible server without ``stream_options``): the
    call is made again unstreamed and answers; a rejected key is not retried."""
    openai.respond_error(400, "Unrecognized request argument supplied: stream_options")
    openai.respond_text("whole")
    sink = ListSink()
    assert call(openai_provider(openai), sink).content == "whole"
    assert [r.body.get("stream") for r in openai.requests] == [True, None]
    assert sink.heard == []
    bad_key = OpenAICompatProvider(base_url=openai.base_url, api_key="sk-wrong")
    with pytest.raises(AuthenticationError):
        call(bad_key, ListSink())
    assert len(openai.requests) == 3


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_a_cancelled_stream_closes_its_connection(wire: str) -> None:
    """Cancelling a streamed call on the worker's pooled session (a task aborted mid-answer)
    closes its connection: the server's next writes fail and it never finishes the answer;
    the session stays open and serves the next call."""
    server_class = FakeOpenAIServer if wire == "openai" else FakeAnthropicServer
    build = OpenAICompatProvider if wire == "openai" else AnthropicProvider
    with server_class(api_key=KEY, chunk_delay_s=0.02) as server:
        server.respond_text(" ".join(f"word{n}" for n in range(10)))  # about 20 frames: 0.4 s
        server.respond_text("done")
        conversation = Conversation(messages=[ConversationMessage.user("hello")])

        async def scenario() -> str:
            session = pooled_session(4)
            async with session:
                provider = build(base_url=server.base_url, api_key=KEY, session=session)
                sink = ListSink()
                with streaming_to(sink):
                    call = asyncio.create_task(provider.complete(conversation, InferenceOptions()))
                    while not sink.heard:
                        await asyncio.sleep(0.01)
                    call.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await call
                await asyncio.sleep(1.5)  # the whole answer would have been written by now
                return (await provider.complete(conversation, InferenceOptions())).content

        assert asyncio.run(scenario()) == "done"
        assert len(server.stream_starts) == 1
        assert server.stream_ends == []
    assert not server.errors, server.errors
