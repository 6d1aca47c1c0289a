"""Redis must keep every key: orga-queue runs only on ``maxmemory-policy noeviction``.

Task records, streams, leases and Celery's queues live in Redis and nowhere else. Under an
evicting policy (``allkeys-lru``, ``volatile-ttl``, ...) a Redis at its ``maxmemory`` deletes
keys to make room, and tasks vanish without a word; under ``noeviction`` it refuses the write
instead, which coordinators and workers ride out until memory is freed. So every coordinator and
worker reads the policy when it starts (``CONFIG GET maxmemory-policy``; where CONFIG is renamed
or disabled, as on some managed Redis, the ``maxmemory_policy`` field of ``INFO memory``) and
refuses to start on any other: :func:`check_eviction_policy`. This module is the decision; the
processes read the values (``coordinator.service``, ``orga.celery``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared.errors import ConfigError

__all__ = [
    "INFO_FIELD",
    "POLICY_SETTING",
    "REQUIRED_POLICY",
    "EvictingRedisError",
    "check_eviction_policy",
    "policy_from_config",
    "policy_from_info",
    "redis_address",
]

POLICY_SETTING = "maxmemory-policy"
"""The Redis setting (``CONFIG GET``, ``redis.conf``)."""
INFO_FIELD = "maxmemory_policy"
"""The same value in ``INFO memory``, read where ``CONFIG`` is not allowed."""
REQUIRED_POLICY = "noeviction"


class EvictingRedisError(ConfigError):
    """The Redis a process was given may delete keys when full (or would not say whether)."""


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value if isinstance(value, str) else None


def policy_from_config(reply: Mapping[Any, Any]) -> str | None:
    """The policy in a ``CONFIG GET maxmemory-policy`` reply (keys and values text or bytes)."""
    for key, value in reply.items():
        if _text(key) == POLICY_SETTING:
            return _text(value)
    return None


def policy_from_info(reply: Mapping[str, Any]) -> str | None:
    """The policy in an ``INFO memory`` reply, as redis-py parses it."""
    return _text(reply.get(INFO_FIELD))


def redis_address(connection_kwargs: Mapping[str, Any]) -> str:
    """Where a client connects, for a message (``host:port/db`` or the socket's path; never
    the password)."""
    db = connection_kwargs.get("db", 0)
    if connection_kwargs.get("path"):
        return f"unix:{connection_kwargs['path']}/{db}"
    return (
        f"{connection_kwargs.get('host', 'localhost')}:{connection_kwargs.get('port', 6379)}/{db}"
    )


def check_eviction_policy(policy: str | None, address: str, unread: str = "") -> str:
    """``policy`` when it is ``noeviction``; else :class:`EvictingRedisError` naming the value,
    the setting and the fix (``unread``: why neither CONFIG GET nor INFO gave it)."""
    if policy == REQUIRED_POLICY:
        return policy
    fix = (
        f"set `{POLICY_SETTING} {REQUIRED_POLICY}` on that Redis (in redis.conf or as "
        f"`redis-server --{POLICY_SETTING} {REQUIRED_POLICY}`; live, `redis-cli CONFIG SET "
        f"{POLICY_SETTING} {REQUIRED_POLICY}`; on a managed Redis, in its parameter group)"
    )
    if policy is None:
        raise EvictingRedisError(
            f"could not read {POLICY_SETTING} of the Redis at {address} "
            f"({unread or 'no value in CONFIG GET or INFO memory'}); orga-queue needs "
            f"{POLICY_SETTING} {REQUIRED_POLICY}, so that a full Redis refuses writes instead of "
            f"deleting tasks: {fix}, and allow this user CONFIG GET or INFO"
        )
    raise EvictingRedisError(
        f"the Redis at {address} has {POLICY_SETTING} {policy}: when full it deletes keys, and "
        f"tasks, their streams and queues vanish without a word; orga-queue needs "
        f"{POLICY_SETTING} {REQUIRED_POLICY} (a full Redis then refuses writes, which the "
        f"runtime rides out): {fix}"
    )
