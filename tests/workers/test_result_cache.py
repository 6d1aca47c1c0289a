"""The result cache behind CachedResult: in memory, on fakeredis, and on a real Redis server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from shared import keys
from tests.conftest import FakeRedisFactory
from tests.redis_server import RedisClientFactory
from workers.result_cache import (
    InMemoryResultCache,
    RedisResultCache,
    ResultCache,
    arguments_digest,
    call_digest,
    call_scope,
    canonical_arguments,
)


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Backend:
    """A cache to test and a way to make time pass for it."""

    open_cache: Callable[[], AbstractAsyncContextManager[ResultCache]]
    advance: Callable[[float], Awaitable[None]]


def _memory_backend() -> Backend:
    clock = FakeClock()

    @asynccontextmanager
    async def open_cache() -> AsyncIterator[ResultCache]:
        yield InMemoryResultCache(clock=clock)

    async def advance(seconds: float) -> None:
        clock.now += seconds

    return Backend(open_cache, advance)


def _redis_backend(factory: RedisClientFactory | FakeRedisFactory) -> Backend:
    @asynccontextmanager
    async def open_cache() -> AsyncIterator[ResultCache]:
        async with factory() as client:
            yield RedisResultCache(client)

    return Backend(open_cache, asyncio.sleep)


@pytest.fixture(
    params=["memory", "fakeredis", pytest.param("redis", marks=pytest.mark.redis)],
)
def backend(request: pytest.FixtureRequest) -> Backend:
    """In memory with a fake clock, fakeredis, or the real Redis server."""
    if request.param == "memory":
        return _memory_backend()
    if request.param == "fakeredis":
        return _redis_backend(request.getfixturevalue("fake_redis"))
    return _redis_backend(request.getfixturevalue("redis_client"))


def _run(backend: Backend, body: Callable[[ResultCache], Awaitable[None]]) -> None:
    async def scenario() -> None:
        async with backend.open_cache() as cache:
            await body(cache)

    asyncio.run(scenario())


def test_canonical_arguments_ignore_key_order_and_spacing() -> None:
    """The same arguments in another order are the same call; other values are not."""
    assert canonical_arguments({"b": 2, "a": [1, "é"]}) == '{"a":[1,"é"],"b":2}'
    assert arguments_digest({"a": 1, "b": 2}) == arguments_digest({"b": 2, "a": 1})
    assert arguments_digest({"a": 1}) != arguments_digest({"a": 2})
    assert len(arguments_digest({})) == 64


def test_caches_implement_the_protocol() -> None:
    """Both caches satisfy the ResultCache protocol; a bad size or TTL is refused."""
    assert isinstance(InMemoryResultCache(), ResultCache)
    assert issubclass(RedisResultCache, ResultCache)
    with pytest.raises(ValueError, match="max_entries must be at least 1, got 0"):
        InMemoryResultCache(max_entries=0)


def test_put_then_get_round_trips(backend: Backend) -> None:
    """A stored result comes back with its metadata and an age near zero."""

    async def body(cache: ResultCache) -> None:
        await cache.put("search", {"q": "x", "n": 1}, "found", {"content_hash": "abc"})
        hit = await cache.get("search", {"n": 1, "q": "x"}, 60)
        assert hit is not None
        assert (hit.content, dict(hit.metadata)) == ("found", {"content_hash": "abc"})
        assert 0 <= hit.age_s < 1

    _run(backend, body)


def test_miss_for_other_tool_or_arguments(backend: Backend) -> None:
    """A result belongs to one tool and one set of arguments."""

    async def body(cache: ResultCache) -> None:
        await cache.put("search", {"q": "x"}, "found", {})
        assert await cache.get("search", {"q": "y"}, 60) is None
        assert await cache.get("lookup", {"q": "x"}, 60) is None

    _run(backend, body)


def test_miss_for_another_task_or_workspace(backend: Backend) -> None:
    """A result belongs to the task and workspace of its call: another task, another
    workspace, and an unscoped lookup all miss; the same scope hits."""
    mine = call_scope("task-a", Path("/ws/a"))

    async def body(cache: ResultCache) -> None:
        await cache.put("file_read", {"path": "notes.txt"}, "task A's notes", {}, scope=mine)
        for other in (
            call_scope("task-b", Path("/ws/b")),
            call_scope("task-b", Path("/ws/a")),
            call_scope("task-a", Path("/ws/b")),
            "",
        ):
            assert await cache.get("file_read", {"path": "notes.txt"}, 60, scope=other) is None
        hit = await cache.get("file_read", {"path": "notes.txt"}, 60, scope=mine)
        assert hit is not None
        assert hit.content == "task A's notes"

    _run(backend, body)


def test_call_digest_depends_on_the_scope() -> None:
    """Unscoped, a call's digest is its arguments' digest; a scope changes it."""
    arguments = {"q": "x"}
    assert call_digest(arguments) == arguments_digest(arguments)
    scoped = call_digest(arguments, call_scope("t", "/ws"))
    assert scoped != arguments_digest(arguments)
    assert scoped == call_digest({"q": "x"}, call_scope("t", Path("/ws")))
    assert scoped != call_digest(arguments, call_scope("t", "/ws2"))


def test_newer_result_replaces_older(backend: Backend) -> None:
    """The cache keeps the last successful result of a call."""

    async def body(cache: ResultCache) -> None:
        await cache.put("search", {"q": "x"}, "old", {})
        await cache.put("search", {"q": "x"}, "new", {"v": "2"})
        hit = await cache.get("search", {"q": "x"}, 60)
        assert hit is not None
        assert (hit.content, dict(hit.metadata)) == ("new", {"v": "2"})

    _run(backend, body)


def test_staleness_limit(backend: Backend) -> None:
    """An entry older than max_staleness is not returned; a younger one is, with its age."""

    async def body(cache: ResultCache) -> None:
        await cache.put("search", {"q": "x"}, "found", {})
        await backend.advance(0.08)
        assert await cache.get("search", {"q": "x"}, 0.04) is None
        hit = await cache.get("search", {"q": "x"}, 10)
        assert hit is not None
        assert 0.07 <= hit.age_s < 5

    _run(backend, body)


def test_memory_cache_evicts_the_oldest_entry() -> None:
    """The in-memory cache keeps at most max_entries, dropping the least recently stored."""

    async def scenario() -> None:
        cache = InMemoryResultCache(max_entries=2)
        await cache.put("t", {"n": 1}, "one", {})
        await cache.put("t", {"n": 2}, "two", {})
        await cache.put("t", {"n": 1}, "one again", {})
        await cache.put("t", {"n": 3}, "three", {})
        assert await cache.get("t", {"n": 2}, 60) is None
        assert [await cache.get("t", {"n": n}, 60) is not None for n in (1, 3)] == [True, True]

    asyncio.run(scenario())


@pytest.mark.redis
def test_redis_entry_layout_and_ttl(redis_client: RedisClientFactory) -> None:
    """An entry is one string under keys.result_cache_key, expiring after the TTL."""

    async def scenario() -> None:
        async with redis_client() as client:
            cache = RedisResultCache(client, ttl_s=30)
            await cache.put("search", {"q": "x"}, "found", {})
            key = keys.result_cache_key("search", arguments_digest({"q": "x"}))
            assert key.startswith("orga:result:search:")
            assert 29_000 < await client.pttl(key) <= 30_000
            default = RedisResultCache(client)
            await default.put("search", {"q": "y"}, "found", {})
            key = keys.result_cache_key("search", arguments_digest({"q": "y"}))
            assert await client.pttl(key) > (keys.result_cache_ttl_s - 5) * 1000

    asyncio.run(scenario())


@pytest.mark.redis
def test_redis_entry_expires(redis_client: RedisClientFactory) -> None:
    """After its TTL the entry is gone, whatever staleness the reader accepts."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            cache = RedisResultCache(client, ttl_s=0.05)
            await cache.put("search", {"q": "x"}, "found", {})
            await asyncio.sleep(0.1)
            assert await cache.get("search", {"q": "x"}, 3600) is None

    asyncio.run(scenario())


@pytest.mark.redis
def test_redis_cache_is_shared_between_clients(redis_client: RedisClientFactory) -> None:
    """A result stored by one worker's client is served to another's."""

    async def scenario() -> None:
        async with redis_client() as writer, redis_client(decode_responses=True) as reader:
            await RedisResultCache(writer).put("search", {"q": "é"}, "trouvé", {"k": "v"})
            hit = await RedisResultCache(reader).get("search", {"q": "é"}, 60)
            assert hit is not None
            assert (hit.content, dict(hit.metadata)) == ("trouvé", {"k": "v"})

    asyncio.run(scenario())


def test_redis_cache_refuses_a_non_positive_ttl(fake_redis: FakeRedisFactory) -> None:
    """A TTL of zero would store nothing: it is refused with the value."""

    async def scenario() -> None:
        async with fake_redis() as client:
            with pytest.raises(ValueError, match="ttl_s must be positive, got 0"):
                RedisResultCache(client, ttl_s=0)

    asyncio.run(scenario())
