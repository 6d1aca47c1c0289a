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
from workers.redis_batch import CoalescedPipeline, OwnPipeline, PipelineRunner, SharedZadd

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


async def _zadds_sent(client: Redis) -> int:
    """How many ``ZADD`` commands the server ran since its stats were reset."""
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_zadd", {}).get("calls", 0))


@pytest.mark.parametrize("kind", ["own", "coalesced"])
def test_shared_zadd_members_are_written_and_their_reply_comes_first(
    redis_client: RedisClientFactory, kind: str
) -> None:
    """Each caller's shared members are in the sorted set, its replies are the ``ZADD``'s
    then its own commands', whatever the runner; a batch sends one ``ZADD`` for them all."""

    async def scenario(client: Redis) -> None:
        runner = _runner(kind, client)
        await client.config_resetstat()

        def own(i: int) -> Callable[[Pipeline], None]:
            return lambda pipe: pipe.incr(f"n{i}")

        replies = await asyncio.gather(
            *(runner.run(own(i), SharedZadd("beats", {f"m{i}": float(i)})) for i in range(5))
        )
        assert [r[1] for r in replies] == [1] * 5
        assert all(isinstance(r[0], int) for r in replies)
        assert await client.zrange("beats", 0, -1, withscores=True) == [
            (f"m{i}".encode(), float(i)) for i in range(5)
        ]
        assert await _zadds_sent(client) == (1 if kind == "coalesced" else 5)
        if isinstance(runner, CoalescedPipeline):
            assert replies[0][0] == 5  # the shared command's reply: five members new
            assert runner.batches_sent == 1

    _run(redis_client, scenario)


def test_a_caller_writing_the_key_itself_ends_the_shared_zadd(
    redis_client: RedisClientFactory,
) -> None:
    """Members shared before a caller's own command on the key go before it, those shared
    after it after it: every write on the key lands in the callers' order (the member's last
    score is the last caller's), as if each caller had sent its own pipeline in turn."""

    async def scenario(client: Redis) -> None:
        runner = CoalescedPipeline(client)
        await client.config_resetstat()
        before, own, after = await asyncio.gather(
            runner.run(lambda p: None, SharedZadd("beats", {"a": 1.0, "b": 1.0})),
            runner.run(lambda p: p.zadd("beats", {"a": -5.0, "b": -5.0})),
            runner.run(lambda p: None, SharedZadd("beats", {"b": 2.0})),
        )
        assert runner.batches_sent == 1
        assert await client.zscore("beats", "a") == -5.0  # the own write came after "before"
        assert await client.zscore("beats", "b") == 2.0  # "after" came after the own write
        assert await _zadds_sent(client) == 3
        assert (before, own, after) == ([2], [0], [0])

    _run(redis_client, scenario)


def test_a_member_shared_twice_in_one_batch_keeps_the_later_callers_score(
    redis_client: RedisClientFactory,
) -> None:
    """Two callers' scores of one member merged: the later one's stays, as two ZADD in a row."""

    async def scenario(client: Redis) -> None:
        runner = CoalescedPipeline(client)
        await asyncio.gather(
            runner.run(lambda p: None, SharedZadd("beats", {"m": -1.0})),
            runner.run(lambda p: None, SharedZadd("beats", {"m": 7.0})),
        )
        assert await client.zscore("beats", "m") == 7.0

    _run(redis_client, scenario)


def test_shared_members_of_a_caller_cancelled_before_the_batch_goes_out_are_not_sent(
    redis_client: RedisClientFactory,
) -> None:
    """A cancelled caller's shared members are taken out with its commands."""

    async def scenario(client: Redis) -> None:
        runner = CoalescedPipeline(client)
        gone = asyncio.ensure_future(runner.run(lambda p: None, SharedZadd("beats", {"g": 1.0})))
        kept = asyncio.ensure_future(runner.run(lambda p: None, SharedZadd("beats", {"k": 1.0})))
        await asyncio.sleep(0)
        gone.cancel()
        assert await kept == [1]
        assert await client.zrange("beats", 0, -1) == [b"k"]

    _run(redis_client, scenario)


def test_an_error_of_the_shared_zadd_reaches_each_of_its_callers_only(
    redis_client: RedisClientFactory,
) -> None:
    """The shared command refused (a key of another type) is each contributor's error reply,
    in its place; their own commands and the other callers' run."""

    async def scenario(client: Redis) -> None:
        runner = CoalescedPipeline(client)
        await client.set("beats", "a string")
        one, two, other = await asyncio.gather(
            runner.run(lambda p: p.incr("x"), SharedZadd("beats", {"a": 1.0})),
            runner.run(lambda p: None, SharedZadd("beats", {"b": 1.0})),
            runner.run(lambda p: p.incr("y")),
        )
        assert isinstance(one[0], ResponseError) and one[1] == 1
        assert len(two) == 1 and isinstance(two[0], ResponseError)
        assert other == [1]

    _run(redis_client, scenario)


def test_a_batch_sent_apart_after_a_data_error_keeps_each_callers_shared_members(
    redis_client: RedisClientFactory,
) -> None:
    """A caller's argument redis-py cannot encode sends each caller alone: the others' shared
    members are written, each in its own caller's pipeline."""

    async def scenario(client: Redis) -> None:
        runner = CoalescedPipeline(client)
        outcomes = await asyncio.gather(
            runner.run(lambda p: None, SharedZadd("beats", {"a": 1.0})),
            runner.run(lambda p: p.get(None)),  # type: ignore[arg-type]
            runner.run(lambda p: p.incr("n"), SharedZadd("beats", {"b": 1.0})),
            return_exceptions=True,
        )
        assert outcomes[0] == [1]
        assert isinstance(outcomes[1], DataError)
        assert outcomes[2] == [1, 1]
        assert await client.zrange("beats", 0, -1) == [b"a", b"b"]

    _run(redis_client, scenario)


def test_shared_zadd_without_members_sends_no_command(redis_client: RedisClientFactory) -> None:
    """No members: no ``ZADD``, no reply; nothing at all when the caller adds nothing else."""

    async def scenario(client: Redis) -> None:
        runner = CoalescedPipeline(client)
        assert await runner.run(lambda p: p.incr("n"), SharedZadd("beats", {})) == [1]
        assert await runner.run(lambda p: None, SharedZadd("beats", {})) == []
        assert await client.exists("beats") == 0

    _run(redis_client, scenario)


def test_names_spelt_as_str_or_bytes_are_one_key_and_one_member_in_one_zadd(
    redis_client: RedisClientFactory,
) -> None:
    """A key (or member) given as ``str`` by one caller and as ``bytes`` by another is one
    key (one member), as Redis sees it: one ``ZADD``, the last caller's score staying, and an
    infinite score (which Redis takes) merged with the others."""

    async def scenario(client: Redis) -> None:
        runner = CoalescedPipeline(client)
        await client.config_resetstat()
        await asyncio.gather(
            runner.run(lambda p: None, SharedZadd("beats", {b"m": 1.0, b"x": float("inf")})),
            runner.run(lambda p: None, SharedZadd(b"beats", {"m": 2.0})),
            runner.run(lambda p: None, SharedZadd("beats", {b"m": 3.0})),
        )
        assert await _zadds_sent(client) == 1
        assert await client.zscore("beats", "m") == 3.0
        assert await client.zscore("beats", "x") == float("inf")

    _run(redis_client, scenario)


def test_a_score_redis_refuses_goes_in_a_zadd_of_its_own(
    redis_client: RedisClientFactory,
) -> None:
    """A caller's NaN score is that caller's error reply, in its place before its own
    commands' replies; the other callers' members are written. Its ``ZADD`` of its own is a
    write of the key by that caller: it ends the merge, as a command of its own would."""

    async def scenario(client: Redis) -> None:
        runner = CoalescedPipeline(client)
        await client.config_resetstat()
        first, refused, last = await asyncio.gather(
            runner.run(lambda p: None, SharedZadd("beats", {"a": 1.0})),
            runner.run(lambda p: p.incr("n"), SharedZadd("beats", {"b": float("nan")})),
            runner.run(lambda p: p.incr("n"), SharedZadd("beats", {"c": 2})),
        )
        assert len(refused) == 2 and isinstance(refused[0], ResponseError) and refused[1] == 1
        assert first == [1] and last == [1, 2]
        assert await _zadds_sent(client) == 3
        assert await client.zrange("beats", 0, -1, withscores=True) == [(b"a", 1.0), (b"c", 2.0)]

    _run(redis_client, scenario)


def test_a_shared_member_the_encoding_refuses_fails_its_batch_as_it_would_alone(
    redis_client: RedisClientFactory,
) -> None:
    """A member ``str`` the client's encoding refuses (a lone surrogate in utf-8) does not
    break laying the batch out: it goes in a ``ZADD`` of its own, and redis-py's error when
    it encodes the batch reaches every caller of it, as any caller's such argument did."""

    async def scenario(client: Redis) -> None:
        runner = CoalescedPipeline(client)
        outcomes = await asyncio.wait_for(
            asyncio.gather(
                runner.run(lambda p: None, SharedZadd("beats", {"a": 1.0})),
                runner.run(lambda p: None, SharedZadd("beats", {"\ud800": 1.0})),
                return_exceptions=True,
            ),
            timeout=5,
        )
        assert all(isinstance(o, UnicodeEncodeError) for o in outcomes), outcomes

    _run(redis_client, scenario)
