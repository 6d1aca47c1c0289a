"""The slow-model benchmark's fake model server: wire format, latency, in-flight and duplicate
counting (``bench/fake_model_server.py``), against the runtime's own OpenAI-compatible provider
and plain httpx. No runtime, no network beyond 127.0.0.1; about two seconds."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from bench.fake_model_server import FakeModelServer, ScriptConfig, task_marker
from shared.conversation import Conversation, ConversationMessage
from shared.inference import FinishReason, InferenceOptions
from workers.providers.openai_compat import OpenAICompatProvider
from workers.providers.streaming import TokenKind, streaming_to

KEY = "test-key"


def _run(config: ScriptConfig, body: Callable[[FakeModelServer], Awaitable[None]]) -> None:
    async def scenario() -> None:
        server = await FakeModelServer(config).start()
        try:
            await body(server)
        finally:
            await server.close()

    asyncio.run(scenario())


def _messages(task: str, tool_results: int) -> list[dict[str, Any]]:
    """A conversation of ``task`` after ``tool_results`` tool calls."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a test."},
        {"role": "user", "content": f"Goal of {task_marker(task)}."},
    ]
    for n in range(tool_results):
        call = {"id": f"c{n}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": "ok"})
    return messages


async def _post(
    client: httpx.AsyncClient, server: FakeModelServer, messages: list[dict[str, Any]]
) -> httpx.Response:
    return await client.post(
        f"{server.url}/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"model": "fake", "messages": messages, "tools": []},
    )


def test_the_runtimes_provider_reads_a_tool_call_then_the_final_answer() -> None:
    """Turns 1..N-1 are tool calls and turn N an answer, as OpenAICompatProvider parses them."""

    async def body(server: FakeModelServer) -> None:
        provider = OpenAICompatProvider(base_url=server.url, model="fake", api_key=KEY)
        conversation = Conversation.with_system("system")
        conversation.push(ConversationMessage.user(f"Do it: {task_marker('wire')}"))
        first = await provider.complete(conversation, InferenceOptions())
        assert first.finish_reason is FinishReason.TOOL_CALLS
        assert [c.name for c in first.tool_calls] == ["file_read"]
        assert json.loads(first.tool_calls[0].arguments)["path"] == "note.txt"
        assert first.usage.total_tokens > 0
        conversation.push(ConversationMessage.assistant_tool_calls(first.tool_calls))
        conversation.push(ConversationMessage.tool_result(first.tool_calls[0].id, "file_read", "x"))
        last = await provider.complete(conversation, InferenceOptions())
        assert last.finish_reason is FinishReason.STOP
        assert last.tool_calls == []
        assert last.content

    _run(ScriptConfig(latency_s=0.0, iterations=2, api_key=KEY), body)


def test_a_wrong_key_is_refused_with_an_openai_error() -> None:
    """Without the Bearer key the server answers 401 with an ``error`` object, and counts no
    call."""

    async def body(server: FakeModelServer) -> None:
        async with httpx.AsyncClient() as client:
            response = await client.post(
                f"{server.url}/chat/completions",
                headers={"Authorization": "Bearer wrong"},
                json={"model": "fake", "messages": _messages("k", 0)},
            )
        assert response.status_code == 401
        assert "error" in response.json()
        assert server.stats()["calls"] == 0
        assert server.stats()["rejected"] == 1

    _run(ScriptConfig(latency_s=0.0, api_key=KEY), body)


def test_latency_and_calls_in_flight_are_measured() -> None:
    """20 concurrent calls of 0.3 s take about 0.3 s, peak at 20 in flight and average near 20
    over the busy window, on keep-alive connections."""

    async def body(server: FakeModelServer) -> None:
        limits = httpx.Limits(max_connections=20, max_keepalive_connections=20)
        async with httpx.AsyncClient(limits=limits) as client:
            started = time.monotonic()
            replies = await asyncio.gather(
                *(_post(client, server, _messages(str(n), 0)) for n in range(20))
            )
            elapsed = time.monotonic() - started
            again = await _post(client, server, _messages("again", 0))
        assert all(r.status_code == 200 for r in [*replies, again])
        assert 0.3 <= elapsed < 1.5
        stats = server.stats(records=True)
        assert stats["peak_inflight"] == 20
        assert stats["inflight"] == 0
        assert stats["mean_inflight"] > 5
        assert stats["calls"] == 21
        assert all(r["end"] - r["start"] >= 0.29 for r in stats["records"])

    _run(ScriptConfig(latency_s=0.3, jitter=0.0, api_key=KEY), body)


def test_jitter_keeps_the_latency_within_its_bounds() -> None:
    """With 50 % jitter every call takes between half and one and a half the latency."""

    async def body(server: FakeModelServer) -> None:
        async with httpx.AsyncClient() as client:
            await asyncio.gather(*(_post(client, server, _messages(str(n), 0)) for n in range(8)))
        durations = [r["end"] - r["start"] for r in server.stats(records=True)["records"]]
        assert all(0.09 <= d <= 0.35 for d in durations)

    _run(ScriptConfig(latency_s=0.2, jitter=0.5, api_key=KEY), body)


def test_a_run_and_turn_get_the_same_latency_in_every_batch() -> None:
    """Markers ``<run>-<n>``: run ``n``'s turn gets one latency whatever the run id and the
    order the calls arrive in, so every system of a benchmark meets the same latencies; other
    runs and turns get others."""
    durations: list[dict[tuple[int, int], float]] = []

    def batch(run: str, order: list[int]) -> Callable[[FakeModelServer], Awaitable[None]]:
        async def body(server: FakeModelServer) -> None:
            async with httpx.AsyncClient() as client:
                for n in order:
                    for turn in (0, 1):
                        reply = await _post(client, server, _messages(f"{run}-{n}", turn))
                        assert reply.status_code == 200
            records = server.stats(records=True)["records"]
            durations.append(
                {(int(r["task"].rsplit("-", 1)[1]), r["turn"]): r["end"] - r["start"]
                 for r in records}
            )  # fmt: skip

        return body

    config = ScriptConfig(latency_s=0.2, jitter=0.5, api_key=KEY)
    _run(config, batch("aaaa", [0, 1, 2]))
    _run(config, batch("bbbb", [2, 0, 1]))
    first, second = durations
    assert first.keys() == second.keys()
    assert all(abs(first[key] - second[key]) < 0.03 for key in first)
    assert max(first.values()) - min(first.values()) > 0.03


def test_a_second_request_for_the_same_task_and_turn_is_a_duplicate() -> None:
    """(marker, turn) identifies a model call: the same turn again is a duplicate, the next
    turn or another task is not; a conversation without a marker is counted apart; reset
    zeroes it all."""

    async def body(server: FakeModelServer) -> None:
        async with httpx.AsyncClient() as client:
            for messages in (
                _messages("a", 0),
                _messages("a", 1),
                _messages("b", 0),
                _messages("a", 1),
                [{"role": "user", "content": "no marker"}],
            ):
                assert (await _post(client, server, messages)).status_code == 200
            stats = server.stats(records=True)
            assert (stats["calls"], stats["distinct_calls"]) == (5, 3)
            assert (stats["duplicates"], stats["unmarked"]) == (1, 1)
            assert [(r["task"], r["turn"]) for r in stats["records"][:4]] == [
                ("a", 1),
                ("a", 2),
                ("b", 1),
                ("a", 2),
            ]
            reset = await client.post(f"{server.url.removesuffix('/v1')}/reset")
            assert reset.status_code == 200
        assert server.stats()["calls"] == 0

    _run(ScriptConfig(latency_s=0.0, api_key=KEY), body)


async def _read_response(reader: asyncio.StreamReader) -> bytes:
    """One HTTP response's status line and headers (its body is read and dropped)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
    await reader.readexactly(length)
    return head


@pytest.mark.parametrize("connection", ["keep-alive", "close"])
def test_raw_http_requests_on_one_connection(connection: str) -> None:
    """Two pipelined requests on one socket get two answers with keep-alive;
    ``Connection: close`` ends the connection after the first."""

    async def body(server: FakeModelServer) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        payload = json.dumps({"model": "m", "messages": _messages("raw", 0)}).encode()
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {KEY}\r\nConnection: {connection}\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode()
        writer.write((head + payload) * 2)
        await writer.drain()
        assert (await _read_response(reader)).startswith(b"HTTP/1.1 200 OK")
        if connection == "close":
            assert await asyncio.wait_for(reader.read(), timeout=5) == b""
        else:
            assert (await _read_response(reader)).startswith(b"HTTP/1.1 200 OK")
        writer.close()
        await writer.wait_closed()

    _run(ScriptConfig(latency_s=0.0, api_key=KEY), body)


def test_a_streamed_request_is_answered_in_the_streaming_wire_format() -> None:
    """``stream: true``: chunked SSE frames after the latency, one every chunk delay; the
    runtime's provider, streaming, reads the same tool call and text as unstreamed."""
    heard: list[str] = []

    class Sink:
        async def emit(self, kind: TokenKind, text: str = "") -> None:
            heard.append(text if kind == "token" else kind)

    config = ScriptConfig(
        latency_s=0.05, jitter=0, iterations=2, api_key=KEY, text_words=20, chunk_delay_s=0.01
    )

    async def body(server: FakeModelServer) -> None:
        provider = OpenAICompatProvider(base_url=server.url, api_key=KEY, model="fake")
        messages = [ConversationMessage.user(f"Goal of {task_marker('s-1')}.")]
        started = time.monotonic()
        with streaming_to(Sink()):
            response = await provider.complete(Conversation(messages=messages), InferenceOptions())
        took = time.monotonic() - started
        assert response.finish_reason is FinishReason.TOOL_CALLS
        assert response.tool_calls[0].name == "file_read"
        assert response.content == " ".join(f"w{n}" for n in range(20))
        assert "".join(h for h in heard if h != "stream_done") == response.content
        assert heard[-1] == "stream_done" and len(heard) > 10
        assert took >= 0.05 + 10 * 0.01
        assert response.usage.total_tokens > 0
        assert server.stats()["calls"] == 1

    _run(config, body)
