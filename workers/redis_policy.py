"""A worker's check, at its start, that its Redis never evicts keys (:mod:`shared.eviction`).

:class:`EvictionCheck` is a bootstep of the worker's blueprint (``orga.celery`` adds it), so
``orga worker`` and a plain ``celery -A orga worker`` both run it: Celery stops a worker whose
bootstep fails to start, with exit code 1 and the error logged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
import redis.cluster
from celery import bootsteps

from shared import keys
from shared.eviction import (
    POLICY_SETTING,
    check_eviction_policy,
    policy_from_config,
    policy_from_info,
    redis_address,
)
from shared.partitions import check_partitions
from workers.app_config import worker_config

__all__ = ["EvictionCheck", "check_redis_keeps_keys", "check_worker_partitions"]


Connect = Callable[..., redis.Redis]
"""Builds a client of the state's Redis (the app's :class:`~workers.app_config.WorkerConfig`
``sync_redis``: a RedisCluster on a
cluster); None: a standalone Redis at the URL."""


def _client(url: str, connect: Connect | None) -> redis.Redis:
    return connect() if connect is not None else redis.Redis.from_url(url)


def check_redis_keeps_keys(url: str, connect: Connect | None = None) -> str:
    """The ``maxmemory-policy`` of the Redis at ``url`` (``noeviction``), by ``CONFIG GET``,
    else ``INFO memory`` where CONFIG is renamed, disabled or refused; an
    :class:`~shared.eviction.EvictingRedisError` naming the value and the fix for any other.
    On a Redis Cluster every node (primaries and replicas: a replica may be promoted) is asked
    and checked, each named by its ``host:port`` (never the URL: it may hold a password)."""
    with _client(url, connect) as client:
        if isinstance(client, redis.cluster.RedisCluster):
            nodes = client.get_nodes()  # type: ignore[no-untyped-call]
            policies = [
                _check_policy(client, f"{node.host}:{node.port}", target_nodes=node)
                for node in nodes
            ]
            return policies[0]
        address = redis_address(client.connection_pool.connection_kwargs)
        return _check_policy(client, address)


def _check_policy(
    client: redis.Redis | redis.cluster.RedisCluster, address: str, **target: Any
) -> str:
    unread = ""
    try:
        policy = policy_from_config(client.config_get(POLICY_SETTING, **target))
    except redis.ResponseError as exc:
        policy, unread = None, f"CONFIG GET: {exc}"
    if policy is None:
        try:
            policy = policy_from_info(client.info("memory", **target))
        except redis.ResponseError as exc:
            unread = f"{unread}; INFO memory: {exc}".lstrip("; ")
    return check_eviction_policy(policy, address, unread)


def check_worker_partitions(url: str, partitions: int, connect: Connect | None = None) -> int:
    """The deployment's partition count, stored if none is; ConfigError (naming both) when
    the worker's ``ORGA_PARTITIONS`` is another."""
    with _client(url, connect) as client:
        client.set(keys.partitions_key, partitions, nx=True)
        stored = client.get(keys.partitions_key)
    return check_partitions(stored, partitions, "worker")


class EvictionCheck(bootsteps.StartStopStep):  # type: ignore[misc]
    """Refuses to start the worker on a Redis that may evict keys, or with another partition
    count than the deployment's."""

    def start(self, parent: Any) -> None:
        config = worker_config(parent.app)
        settings, connect = config.settings, config.sync_redis
        assert settings.redis_url is not None  # create_app refuses a worker without it
        check_redis_keeps_keys(settings.redis_url, connect)
        check_worker_partitions(settings.redis_url, settings.partitions, connect)
