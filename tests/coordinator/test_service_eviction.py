"""A coordinator (and a worker) refuses a Redis that may evict keys, read from a real
``redis-server``: by CONFIG GET, or by INFO memory where CONFIG is renamed away."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis
from redis.asyncio import Redis

from coordinator.service import Coordinator, check_cluster_mode, check_redis_keeps_keys
from shared import keys
from shared.errors import ConfigError
from shared.eviction import EvictingRedisError
from tests.redis_server import RedisServer
from workers.redis_policy import check_redis_keeps_keys as worker_check

Factory = Callable[..., RedisServer]
NO_CONFIG = ("--rename-command", "CONFIG", "")
"""As on managed Redis that disable CONFIG: the policy is then read from INFO memory."""


async def _coordinator_check(url: str) -> str:
    client = Redis.from_url(url)
    try:
        return await check_redis_keeps_keys(client)
    finally:
        await client.aclose()


def _both_checks(url: str) -> list[str | BaseException]:
    """What the coordinator's and the worker's checks say of the Redis at ``url``."""
    said: list[str | BaseException] = []
    for check in (lambda: asyncio.run(_coordinator_check(url)), lambda: worker_check(url)):
        try:
            said.append(check())
        except EvictingRedisError as exc:
            said.append(exc)
    return said


@pytest.mark.parametrize("options", [(), NO_CONFIG])
def test_the_runtimes_own_redis_is_accepted(
    redis_server_factory: Factory, options: tuple[str, ...]
) -> None:
    """The Redis `orga run` and the tests start (EmbeddedRedis) is noeviction, read either way."""
    server = redis_server_factory(options=options)
    assert _both_checks(server.url) == ["noeviction", "noeviction"]


@pytest.mark.parametrize("options", [(), NO_CONFIG])
@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl"])
def test_an_evicting_redis_is_refused_by_coordinators_and_workers(
    redis_server_factory: Factory, policy: str, options: tuple[str, ...]
) -> None:
    """Either check refuses, naming the policy, the setting and the fix, with CONFIG or not."""
    server = redis_server_factory(options=("--maxmemory-policy", policy, *options))
    for said in _both_checks(server.url):
        assert isinstance(said, EvictingRedisError), said
        assert f"has maxmemory-policy {policy}:" in str(said)
        assert f"127.0.0.1:{server.port}/0" in str(said)
        assert "set `maxmemory-policy noeviction`" in str(said)


def test_a_coordinator_on_an_evicting_redis_stops_before_serving(
    redis_server_factory: Factory,
) -> None:
    """Coordinator.run raises at once: no consumer group is created, no entry is read."""
    server = redis_server_factory(options=("--maxmemory-policy", "allkeys-lru"))

    async def scenario() -> None:
        client = Redis.from_url(server.url)
        try:
            with pytest.raises(EvictingRedisError, match="allkeys-lru"):
                await asyncio.wait_for(Coordinator(client).run(), 10)
        finally:
            await client.aclose()

    asyncio.run(scenario())
    with redis.Redis.from_url(server.url) as client:
        assert not client.exists(keys.intake_stream(0))


def test_a_coordinator_given_a_cluster_node_as_a_standalone_redis_stops_before_serving(
    redis_server_factory: Factory,
) -> None:
    """A node of a Redis Cluster reached without ``ORGA_REDIS_CLUSTER``: every key of a slot
    on another node answers MOVED, which the coordinator waits out as a slot being moved
    (a reshard), forever. It refuses at start instead, naming the node and the setting."""
    server = redis_server_factory(options=("--cluster-enabled", "yes"))

    async def scenario() -> None:
        client = Redis.from_url(server.url)
        try:
            with pytest.raises(ConfigError) as caught:
                await asyncio.wait_for(Coordinator(client).run(), 10)
        finally:
            await client.aclose()
        message = str(caught.value)
        assert f"127.0.0.1:{server.port}/0" in message
        assert "cluster_enabled:1" in message and "ORGA_REDIS_CLUSTER=true" in message

    asyncio.run(scenario())


def test_a_standalone_redis_is_not_taken_for_a_cluster_node(
    redis_server_factory: Factory,
) -> None:
    """The check reads ``INFO cluster``: a standalone Redis (cluster_enabled:0) passes."""
    server = redis_server_factory()

    async def scenario() -> None:
        client = Redis.from_url(server.url)
        try:
            await check_cluster_mode(client)
        finally:
            await client.aclose()

    asyncio.run(scenario())
