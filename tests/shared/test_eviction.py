"""Redis must not evict: the decision on a ``maxmemory-policy`` and the message that refuses one."""

from __future__ import annotations

import pytest

from shared.errors import ConfigError
from shared.eviction import (
    EvictingRedisError,
    check_eviction_policy,
    policy_from_config,
    policy_from_info,
    redis_address,
)

EVICTING = [
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
]


def test_noeviction_is_accepted() -> None:
    """The one policy under which a full Redis refuses writes instead of deleting keys."""
    assert check_eviction_policy("noeviction", "127.0.0.1:6379/0") == "noeviction"


@pytest.mark.parametrize("policy", EVICTING)
def test_every_evicting_policy_is_refused_naming_the_value_the_setting_and_the_fix(
    policy: str,
) -> None:
    """The refusal is a ConfigError naming the Redis, its policy, the setting and the fix."""
    with pytest.raises(EvictingRedisError) as refused:
        check_eviction_policy(policy, "redis.internal:6380/2")
    message = str(refused.value)
    assert isinstance(refused.value, ConfigError)
    assert f"the Redis at redis.internal:6380/2 has maxmemory-policy {policy}:" in message
    assert "set `maxmemory-policy noeviction` on that Redis" in message
    assert "CONFIG SET maxmemory-policy noeviction" in message


def test_a_policy_that_could_not_be_read_is_refused_saying_why() -> None:
    """Neither CONFIG GET nor INFO answering is no proof: refused, with both reasons."""
    with pytest.raises(EvictingRedisError, match="could not read maxmemory-policy") as refused:
        check_eviction_policy(None, "h:1/0", "CONFIG GET: unknown command; INFO memory: NOPERM")
    assert "(CONFIG GET: unknown command; INFO memory: NOPERM)" in str(refused.value)
    assert "allow this user CONFIG GET or INFO" in str(refused.value)


def test_the_policy_is_read_from_either_reply() -> None:
    """CONFIG GET's reply (text or bytes) and INFO memory's field give the same policy."""
    assert policy_from_config({"maxmemory-policy": "allkeys-lru"}) == "allkeys-lru"
    assert policy_from_config({b"maxmemory-policy": b"noeviction"}) == "noeviction"
    assert policy_from_config({}) is None
    info = {"maxmemory_policy": "volatile-ttl", "used_memory": 1}
    assert policy_from_info(info) == "volatile-ttl"
    assert policy_from_info({}) is None


def test_the_address_in_a_message_never_holds_the_password() -> None:
    """host:port/db, or the unix socket, without credentials."""
    tcp = {"host": "r", "port": 6380, "db": 3, "password": "s3cret", "username": "u"}
    assert redis_address(tcp) == "r:6380/3"
    assert redis_address({"path": "/run/redis.sock", "db": 0, "password": "x"}) == (
        "unix:/run/redis.sock/0"
    )
