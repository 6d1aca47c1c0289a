"""Review of branch ``cmds5``: the shared ``ZADD`` of :class:`CoalescedPipeline` against the
guarantees its module states ("nothing of the order on that key changes"; "other callers'
errors never reach it").

Each caller here asks for members of a sorted set the way the branch offers it
(:class:`~workers.redis_batch.SharedZadd`); on a tree without it (``main``) the same caller
adds its own ``ZADD`` first in its pipeline, which is what every start did there. The
assertions are the behaviour of those callers sent each in its own pipeline, in turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError

from tests.redis_server import RedisClientFactory
from workers import redis_batch
from workers.redis_batch import CoalescedPipeline

pytestmark = pytest.mark.redis

Scenario = Callable[[Redis], Awaitable[None]]
Build = Callable[[Pipeline], object]


def _run(redis_client: RedisClientFactory, scenario: Scenario) -> None:
    async def main() -> None:
        async with redis_client() as client:
            await scenario(client)

    asyncio.run(main())


def _call(
    runner: CoalescedPipeline,
    key: Any,
    members: Mapping[Any, float],
    build: Build = lambda pipe: None,
) -> Awaitable[list[Any]]:
    """A caller whose pipeline is ``ZADD key members`` then ``build``'s commands."""
    shared = getattr(redis_batch, "SharedZadd", None)
    if shared is not None:
        return runner.run(build, shared(key, members))

    def own(pipe: Pipeline) -> None:  # pragma: no cover - the tree before the branch
        pipe.zadd(key, dict(members))
        build(pipe)

    return runner.run(own)


def test_a_callers_write_of_the_key_given_as_bytes_still_orders_the_later_shared_members(
    redis_client: RedisClientFactory,
) -> None:
    """A caller's own ``ZADD`` of the key (given as ``bytes``, as redis-py accepts) between two
    callers' shared members: the later caller's score must win, as its pipeline came after.
    The branch matches the key by its ``str`` among the arguments, so it merges the later
    members into the ``ZADD`` before the own write, and the own write's stale score stays."""

    async def scenario(client: Redis) -> None:
        runner = CoalescedPipeline(client)
        await asyncio.gather(
            _call(runner, "beats", {"a": 1.0}),
            runner.run(lambda p: p.zadd(b"beats", {"m": -5.0})),  # e.g. an answer mark
            _call(runner, "beats", {"m": 2.0}),  # a later start of the same member
        )
        assert runner.batches_sent == 1
        assert await client.zscore("beats", "m") == 2.0

    _run(redis_client, scenario)


def test_shared_members_for_one_key_spelt_as_str_and_bytes_land_in_the_callers_order(
    redis_client: RedisClientFactory,
) -> None:
    """Three callers' members for one Redis key, the middle one naming it as ``bytes``: the
    last caller's score must win. The branch merges per Python key, so the first and the
    last callers' members go in one ``ZADD`` before the middle one's."""

    async def scenario(client: Redis) -> None:
        runner = CoalescedPipeline(client)
        await asyncio.gather(
            _call(runner, "beats", {"m": 1.0}),
            _call(runner, b"beats", {"m": 2.0}),
            _call(runner, "beats", {"m": 3.0}),
        )
        assert await client.zscore("beats", "m") == 3.0

    _run(redis_client, scenario)


def test_one_callers_refused_score_does_not_refuse_the_other_callers_members(
    redis_client: RedisClientFactory,
) -> None:
    """One caller's score Redis refuses (NaN: "not a valid float") is that caller's error
    reply only: the other caller's members are written and its reply is no error, as with
    a pipeline each. The branch merges them into one ``ZADD``, which Redis refuses whole:
    the good caller's heartbeat is not written and its start raises."""

    async def scenario(client: Redis) -> None:
        runner = CoalescedPipeline(client)
        good, bad = await asyncio.gather(
            _call(runner, "beats", {"a": 1.0}),
            _call(runner, "beats", {"b": float("nan")}),
        )
        assert isinstance(bad[0], ResponseError)
        assert not isinstance(good[0], Exception), good
        assert await client.zscore("beats", "a") == 1.0

    _run(redis_client, scenario)
