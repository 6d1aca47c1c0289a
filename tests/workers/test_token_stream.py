"""The worker's token sink on a real Redis: pieces in order, restarts, the cap and the expiry."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from shared import keys
from shared.protocol import Fence
from shared.tokens import AnswerView, TokenEntry, token_entry
from tests.conftest import RedisClientFactory
from workers.providers.streaming import TokenKind
from workers.token_stream import ListTokenSink, RedisTokenSink

pytestmark = pytest.mark.redis


def _fence(attempt: int = 0, iteration: int = 2) -> Fence:
    return Fence(task_id="tok-task", step_id="main", iteration=iteration, attempt=attempt)


async def _entries(client: Redis) -> list[TokenEntry]:
    rows = await client.xrange(keys.tokens_stream("tok-task", 0))
    return [e for e in (token_entry(i, f) for i, f in rows) if e is not None]


def test_pieces_are_published_in_order_then_done(redis_client: RedisClientFactory) -> None:
    """Every piece arrives, in order (coalesced: a burst in a few writes), then done; the
    stream expires after its last write."""

    async def scenario() -> None:
        async with redis_client() as client:
            sink = RedisTokenSink(client, _fence())
            words = [f"w{i} " for i in range(50)]
            for word in words:
                await sink.emit("token", word)
            await sink.emit("stream_done")
            entries = await _entries(client)
            pieces = [e.text for e in entries if e.kind == "token"]
            assert "".join(pieces) == "".join(words)
            assert len(pieces) < 10, "pieces that come together are written together"
            assert entries[-1].kind == "stream_done"
            assert {(e.step, e.iteration, e.attempt, e.purpose) for e in entries} == {
                ("main", 3, 0, "act")
            }
            assert 0 < await client.ttl(keys.tokens_stream("tok-task", 0)) <= keys.tokens_ttl_s

    asyncio.run(scenario())


def test_a_redelivered_answer_starts_with_stream_restarted(
    redis_client: RedisClientFactory,
) -> None:
    """A second call for the same step and iteration (a re-sent dispatch) writes
    stream_restarted first; watchers then show only the second answer, whole."""

    async def scenario() -> None:
        async with redis_client() as client:
            first = RedisTokenSink(client, _fence(attempt=0))
            await first.emit("token", "half an ans")  # killed here
            await asyncio.sleep(0.05)
            second = RedisTokenSink(client, _fence(attempt=1))
            await second.emit("token", "The whole answer.")
            await second.emit("stream_done")
            entries = await _entries(client)
            kinds = [e.kind for e in entries]
            assert kinds == ["token", "stream_restarted", "token", "stream_done"]
            assert entries[1].attempt == 1
            view = AnswerView()
            for entry in entries:
                view.apply(entry)
            assert (view.text, view.done, view.restarts) == ("The whole answer.", True, 1)
            # The next iteration is a new answer, not a restart.
            third = RedisTokenSink(client, _fence(attempt=0, iteration=3))
            await third.emit("stream_done")
            assert [e.kind for e in await _entries(client)][-1] == "stream_done"

    asyncio.run(scenario())


def test_the_stream_is_capped(redis_client: RedisClientFactory) -> None:
    """The stream keeps about ``maxlen`` entries."""

    async def scenario() -> None:
        async with redis_client() as client:
            sink = RedisTokenSink(client, _fence(), maxlen=10, flush_every_s=0)
            for i in range(300):  # 600 writes: each piece, then the end waiting for it
                await sink.emit("token", str(i))
                await sink.emit("stream_done")
            assert await client.xlen(keys.tokens_stream("tok-task", 0)) < 150

    asyncio.run(scenario())


def _merged(entries: list[TokenEntry]) -> list[tuple[str, str, int, int, str, str]]:
    """The entries with consecutive pieces of one answer joined (a Redis sink coalesces a
    burst into one write; which pieces go together depends only on timing)."""
    merged: list[tuple[str, str, int, int, str, str]] = []
    for e in entries:
        row = (e.kind, e.step, e.iteration, e.attempt, e.purpose, e.text)
        if merged and e.kind == "token" and merged[-1][0] == "token" and merged[-1][:5] == row[:5]:
            merged[-1] = (*row[:5], merged[-1][5] + e.text)
        else:
            merged.append(row)
    return merged


def test_the_in_process_sink_keeps_the_entries_the_redis_sink_writes(
    redis_client: RedisClientFactory,
) -> None:
    """The in-process driver's ListTokenSink and the worker's RedisTokenSink, told the same
    answers (one cut short and re-sent, then the next iteration's), hold the same entries:
    the same fields, the same stream_restarted, the same text."""
    script: list[tuple[Fence, list[tuple[TokenKind, str]]]] = [
        (_fence(attempt=0), [("token", "half an "), ("token", "ans")]),
        (_fence(attempt=1), [("token", "The whole "), ("token", "answer."), ("stream_done", "")]),
        (_fence(attempt=1, iteration=3), [("token", "Next."), ("stream_done", "")]),
    ]

    async def scenario() -> None:
        kept: list[TokenEntry] = []
        async with redis_client() as client:
            for fence, emits in script:
                sinks = (RedisTokenSink(client, fence, "plan"), ListTokenSink(kept, fence, "plan"))
                for sink in sinks:
                    for kind, text in emits:
                        await sink.emit(kind, text)
                await asyncio.sleep(0.06)  # the Redis sink's last burst written
            written = await _entries(client)
        assert _merged(kept) == _merged(written)
        assert [e.kind for e in kept].count("stream_restarted") == 1

    asyncio.run(scenario())
