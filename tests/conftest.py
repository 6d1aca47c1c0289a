"""Test-wide fixtures: a real Redis server for tests whose meaning depends on Redis, and fakeredis.

Real Redis (``@pytest.mark.redis``; tests using these fixtures are marked automatically):

* ``redis_url`` (session): ``ORGA_TEST_REDIS_URL`` when set (its database is flushed before
  each test), else a private ``redis-server`` started once for the session
  (``tests.redis_server.RedisServer``).
* ``redis_client`` (function): the database is flushed first; returns a factory whose call is an
  async context manager, used inside ``asyncio.run``::

      def test_something(redis_client):
          async def scenario():
              async with redis_client() as client:
                  await client.set("k", "v")
          asyncio.run(scenario())

* ``redis_server_factory`` (function): starts extra private servers (``appendonly=True`` to
  test restarts with ``server.restart()``; ``options`` for more ``redis-server`` options),
  stopped and removed at the end of the test.

When no server can be started, these fixtures FAIL if the environment variable ``CI`` is
``true`` (tests needing Redis always run in CI) and skip with the reason otherwise.

Fakes: ``fake_redis`` (function) is the same kind of factory over ``fakeredis`` (one fresh fake
server per test), for unit tests that do not depend on Redis semantics (no Lua here).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import NoReturn

import fakeredis
import pytest
import redis
from redis.asyncio import Redis

from tests.redis_server import RedisClientFactory, RedisServer, RedisUnavailableError

__all__ = ["FakeRedisFactory", "RedisClientFactory"]

_REDIS_FIXTURES = frozenset({"redis_url", "redis_client", "redis_server_factory"})


class FakeRedisFactory:
    """Opens ``fakeredis`` async clients that all share one fake server."""

    def __init__(self) -> None:
        self.server = fakeredis.FakeServer()

    def __call__(self, *, decode_responses: bool = False) -> AbstractAsyncContextManager[Redis]:
        return self._open(decode_responses)

    @asynccontextmanager
    async def _open(self, decode_responses: bool) -> AsyncIterator[Redis]:
        client = fakeredis.FakeAsyncRedis(server=self.server, decode_responses=decode_responses)
        try:
            yield client
        finally:
            await client.aclose()


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"Redis is required in CI and could not be started: {reason}", pytrace=False)
    pytest.skip(f"no Redis server available: {reason}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses a real-Redis fixture with ``redis``."""
    for item in items:
        if _REDIS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.redis)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The URL of a real Redis server for the whole session."""
    configured = os.environ.get("ORGA_TEST_REDIS_URL")
    if configured:
        yield configured
        return
    server = RedisServer()
    try:
        server.start()
    except RedisUnavailableError as error:
        server.cleanup()
        _unavailable(str(error))
    try:
        yield server.url
    finally:
        server.cleanup()


@pytest.fixture
def redis_client(redis_url: str) -> RedisClientFactory:
    """A factory of async clients on a freshly flushed database."""
    with redis.Redis.from_url(redis_url) as client:
        client.flushdb()
    return RedisClientFactory(redis_url)


@pytest.fixture
def redis_server_factory() -> Iterator[Callable[..., RedisServer]]:
    """Start extra private Redis servers: ``redis_server_factory(appendonly=True)``,
    ``redis_server_factory(options=("--maxmemory-policy", "allkeys-lru"))``."""
    servers: list[RedisServer] = []

    def start(*, appendonly: bool = False, options: tuple[str, ...] = ()) -> RedisServer:
        server = RedisServer(appendonly=appendonly, options=options)
        servers.append(server)
        try:
            server.start()
        except RedisUnavailableError as error:
            _unavailable(str(error))
        return server

    yield start
    for server in servers:
        server.cleanup()


@pytest.fixture
def fake_redis() -> FakeRedisFactory:
    """A factory of fakeredis async clients sharing one fresh fake server."""
    return FakeRedisFactory()
