"""Coalesced pipelines on a real Redis: one pipeline per loop turn, each caller its own replies."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, ResponseError

from shared import keys
from tests.redis_server import RedisClientFactory
from workers.circuit_breaker import CircuitBreakerRegistry, RedisBreakerStore
from workers.redis_batch import CoalescedPipeline, OwnPipeline, PipelineRunner

pytestmark = pytest.mark.redis

Scenario = Callable[[Redis], Awaitable[None]]


def _run(redis_client: RedisClientFactory, scenario: Scenario) -> None:
    async def main() -> None:
        async with redis_client() as client:
            await scenario(client)

    asyncio.run(main())


def _runner(kind: str, client: Redis) -> PipelineRunner:
    return CoalescedPipeline(client) if kind == "coalesced" else OwnPipeline(client)


@pytest.mark.parametrize("kind", ["own", "coalesced"])
def test_each_caller_gets_the_replies_of_its_own_commands_in_order(
    redis_client: RedisClientFactory, kind: str
) -> None:
    """Concurrent callers' replies are theirs, in their commands' order, whatever the runner."""

    async def scenario(client: Redis) -> None:
        runner = _runner(kind, client)

        def build(i: int) -> Callable[[Pipeline], None]:
            def add(pipe: Pipeline) -> None:
                pipe.set(f"k{i}", i)
                pipe.incrby(f"k{i}", 10)
                pipe.get(f"k{i}")

            return add

        replies = await asyncio.gather(*(runner.run(build(i)) for i in range(20)))
        assert replies == [[True, i + 10, str(i + 10).encode()] for i in range(20)]
        if isinstance(runner, CoalescedPipeline):
            assert runner.batches_sent == 1

    _run(redis_client, scenario)


@pytest.mark.parametrize("kind", ["own", "coalesced"])
def test_an_error_reply_is_only_its_callers(redis_client: RedisClientFactory, kind: str) -> None:
    """A command's error is in its caller's replies, where its command is; nobody else sees it."""

    async def scenario(client: Redis) -> None:
        runner = _runner(kind, client)
        await client.set("text", "not a number")
        bad, good = await asyncio.gather(
            runner.run(lambda p: (p.incr("text"), p.get("text"))),
            runner.run(lambda p: p.incr("n")),
        )
        assert isinstance(bad[0], ResponseError)
        assert bad[1] == b"not a number"
        assert good == [1]

    _run(redis_client, scenario)


@pytest.mark.parametrize("kind", ["own", "coalesced"])
def test_an_argument_redis_py_cannot_encode_fails_only_its_caller(
    redis_client: RedisClientFactory, kind: str
) -> None:
    """redis-py refuses a ``None`` argument (``DataError``) while packing the pipeline, before
    sending anything: only the caller that passed it raises; the others' commands run once."""

    async def scenario(client: Redis) -> None:
        runner = _runner(kind, client)
        outcomes = await asyncio.gather(
            runner.run(lambda p: p.incr("counted")),
            runner.run(lambda p: p.get(None)),  # type: ignore[arg-type]
            runner.run(lambda p: p.incr("counted")),
            return_exceptions=True,
        )
        assert isinstance(outcomes[1], DataError)
        assert sorted(outcomes[0] + outcomes[2]) == [1, 2]  # type: ignore[operator]
        assert await client.get("counted") == b"2"

    _run(redis_client, scenario)


def test_a_lost_connection_reaches_every_caller() -> None:
    """The pipeline failing as a whole raises its error to each caller of the batch."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]

    async def scenario() -> None:
        client = Redis(port=port, retry=Retry(NoBackoff(), 0), socket_connect_timeout=1)
        runner = CoalescedPipeline(client)
        results = await asyncio.gather(
            *(runner.run(lambda p: p.get("k")) for _ in range(3)), return_exceptions=True
        )
        assert all(isinstance(r, RedisConnectionError) for r in results), results
        assert runner.batches_sent == 1
        await client.aclose()

    asyncio.run(scenario())


def test_a_caller_cancelled_before_the_batch_goes_out_sends_nothing(
    redis_client: RedisClientFactory,
) -> None:
    """A caller cancelled while its batch waits for the loop turn's end has its commands
    taken out; the others' go out."""

    async def scenario(client: Redis) -> None:
        runner = CoalescedPipeline(client)
        gone = asyncio.ensure_future(runner.run(lambda p: p.incr("gone")))
        kept = asyncio.ensure_future(runner.run(lambda p: p.incr("kept")))
        await asyncio.sleep(0)  # both registered; the flush is scheduled after them
        gone.cancel()
        assert await kept == [1]
        assert gone.cancelled()
        assert await client.get("gone") is None

    _run(redis_client, scenario)


def test_a_caller_cancelled_while_the_batch_is_out_cancels_it_for_nobody(
    redis_client: RedisClientFactory,
) -> None:
    """Cancelling one caller of a batch already sent leaves the batch running: the others get
    their replies, and each command ran once."""

    async def scenario(client: Redis) -> None:
        runner = CoalescedPipeline(client)
        callers = [asyncio.ensure_future(runner.run(lambda p: p.incr("n"))) for _ in range(3)]
        while runner.batches_sent == 0:
            await asyncio.sleep(0)
        callers[0].cancel()
        results = await asyncio.gather(*callers, return_exceptions=True)
        assert isinstance(results[0], asyncio.CancelledError)
        assert sorted(r[0] for r in results[1:] if isinstance(r, list)) in ([1, 2], [2, 3])
        await runner.aclose()
        assert await client.get("n") == b"3", "every command sent once, none twice"

    _run(redis_client, scenario)


def test_a_full_batch_goes_out_at_once(redis_client: RedisClientFactory) -> None:
    """At ``max_commands`` a batch is sent without waiting for the loop turn's end; the next
    callers start another."""

    async def scenario(client: Redis) -> None:
        runner = CoalescedPipeline(client, max_commands=4)

        def set_get(i: int) -> Callable[[Pipeline], None]:
            def add(pipe: Pipeline) -> None:
                pipe.set(f"k{i}", i)
                pipe.get(f"k{i}")

            return add

        replies = await asyncio.gather(*(runner.run(set_get(i)) for i in range(5)))
        assert replies == [[True, str(i).encode()] for i in range(5)]
        assert runner.batches_sent == 3  # 2 callers + 2 callers + 1 caller

    _run(redis_client, scenario)


def test_a_builder_that_raises_sends_nothing_and_spares_the_others(
    redis_client: RedisClientFactory,
) -> None:
    """A builder's exception is its caller's, raised before anything is sent; its commands
    added before it raised are dropped."""

    async def scenario(client: Redis) -> None:
        runner = CoalescedPipeline(client)

        def broken(pipe: Pipeline) -> None:
            pipe.incr("broken")
            raise ValueError("no such thing")

        results = await asyncio.gather(
            runner.run(broken), runner.run(lambda p: p.incr("fine")), return_exceptions=True
        )
        assert isinstance(results[0], ValueError)
        assert results[1] == [1]
        assert await client.get("broken") is None

    _run(redis_client, scenario)


def test_a_caller_adding_nothing_gets_no_replies_and_sends_nothing(
    redis_client: RedisClientFactory,
) -> None:
    """An empty build returns [] at once."""

    async def scenario(client: Redis) -> None:
        runner = CoalescedPipeline(client)
        assert await runner.run(lambda p: None) == []
        await asyncio.sleep(0)
        assert runner.batches_sent == 0

    _run(redis_client, scenario)


def test_max_commands_below_one_is_refused() -> None:
    """A batch cap of 0 says what to pass instead."""
    with pytest.raises(ValueError, match="pass 1"):
        CoalescedPipeline(Redis(), max_commands=0)


def test_concurrent_breaker_checks_share_one_pipeline_and_survive_a_script_flush(
    redis_client: RedisClientFactory,
) -> None:
    """Breaker checks of one loop turn go out together by SHA; after SCRIPT FLUSH (NOSCRIPT:
    nothing ran) each check loads the script and runs once."""

    async def scenario(client: Redis) -> None:
        runner = CoalescedPipeline(client)
        registry = CircuitBreakerRegistry(RedisBreakerStore(client, pipelines=runner))
        await asyncio.gather(*(registry.check(f"t{i}") for i in range(10)))
        assert runner.batches_sent == 1
        await client.script_flush()
        probe = CircuitBreakerRegistry(RedisBreakerStore(client, pipelines=runner))
        await _open_then_probe(client, probe)

    _run(redis_client, scenario)


async def _open_then_probe(client: Redis, registry: CircuitBreakerRegistry) -> None:
    """An open breaker past its recovery admits exactly one half-open probe, NOSCRIPT or not."""
    for _ in range(3):
        await registry.record_failure("p")
    await client.hset(keys.breaker_key("p"), "opened_at", 0)
    await client.script_flush()
    results: list[Any] = await asyncio.gather(
        *(registry.check("p") for _ in range(5)), return_exceptions=True
    )
    assert sum(r is None for r in results) == 1, results
    assert int(await client.hget(keys.breaker_key("p"), "half_open_calls") or 0) == 1
