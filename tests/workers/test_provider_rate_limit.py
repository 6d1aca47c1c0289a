"""Transient provider errors are waited out up to the retry deadline, and a 429 holds every
caller of the same provider and key off through one Redis key (real Redis: a Lua script)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from shared import keys
from tests.conftest import RedisClientFactory
from tests.fakes.llm_server import FakeOpenAIServer
from workers.providers import RateLimitedError
from workers.providers._http import Endpoint, JsonPoster
from workers.providers.rate_limit import (
    RedisThrottle,
    key_digest,
    recording_waits,
)
from workers.providers.retry import RetryPolicy

OK = {"choices": []}
BODY = {"model": "m", "messages": []}


class FakeClock:
    """A monotonic clock that only moves when the poster sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.delays: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.now += seconds


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    """A fake OpenAI server without a key check; it must end without handler errors."""
    with FakeOpenAIServer() as fake:
        yield fake
    assert not fake.errors, fake.errors


def _answers(server: FakeOpenAIServer, *statuses: int, retry_after: str = "2") -> None:
    """Queue the given statuses in order (429s with Retry-After), then 200."""
    for status in statuses:
        headers = {"retry-after": retry_after} if status == 429 else {}
        server.respond_json({"error": {"message": "slow down"}}, status=status, headers=headers)
    server.respond_json(OK)


def _endpoint(server: FakeOpenAIServer) -> Endpoint:
    return Endpoint("openai", server.base_url, "ORGA_API_KEY")


def _poster(server: FakeOpenAIServer, clock: FakeClock, deadline_s: float) -> JsonPoster:
    return JsonPoster(
        _endpoint(server),
        timeout_s=5,
        retry=RetryPolicy(max_retries=3, deadline_s=deadline_s),
        sleep=clock.sleep,
        rand=lambda: 0.0,
        clock=clock,
    )


def test_rate_limits_are_waited_out_past_the_retry_count_within_the_deadline(
    server: FakeOpenAIServer,
) -> None:
    """Eight 429s (more than max_retries) and a 503 are waited out, honouring Retry-After;
    every wait is recorded with its status and whether the server set it."""
    clock = FakeClock()
    _answers(server, *[429] * 8, 503)
    poster = _poster(server, clock, deadline_s=60)

    async def call() -> list[float]:
        with recording_waits() as waits:
            await poster.post("chat/completions", headers={}, body=BODY, model="m")
        assert [w.status for w in waits] == [429] * 8 + [503]
        assert all(w.retry_after for w in waits[:8]) and not waits[8].retry_after
        return [w.wait_s for w in waits]

    # the 503 has no Retry-After: the backoff of the ninth try, capped at backoff_max_s (8 s)
    assert asyncio.run(call()) == [2.0] * 8 + [8.0]
    assert clock.delays == [2.0] * 8 + [8.0]


def test_past_the_deadline_the_rate_limit_is_an_error(server: FakeOpenAIServer) -> None:
    """When the next wait would end past the deadline, the 429 is raised with its message."""
    clock = FakeClock()
    _answers(server, *[429] * 20)
    poster = _poster(server, clock, deadline_s=7)
    with pytest.raises(RateLimitedError, match="HTTP 429"):
        asyncio.run(poster.post("chat/completions", headers={}, body=BODY, model="m"))
    assert clock.delays == [2.0, 2.0, 2.0]


def test_without_a_deadline_the_retry_count_applies(server: FakeOpenAIServer) -> None:
    """deadline_s=0 keeps the old rule: max_retries retries, then the error."""
    clock = FakeClock()
    _answers(server, *[429] * 20)
    poster = _poster(server, clock, deadline_s=0)
    with pytest.raises(RateLimitedError):
        asyncio.run(poster.post("chat/completions", headers={}, body=BODY, model="m"))
    assert len(clock.delays) == 3


def test_a_429_holds_every_caller_of_the_key_off(
    redis_client: RedisClientFactory, server: FakeOpenAIServer
) -> None:
    """One poster's 429 (Retry-After 30) makes another poster of the same provider and key wait
    before its first call; the hold only moves later; the key name holds a hash, not the key."""
    secret = "sk-very-secret"
    endpoint = _endpoint(server)
    key = keys.provider_limit_key("openai", key_digest(endpoint.base_url, secret))
    assert secret not in key

    async def scenario() -> None:
        async with redis_client() as redis:
            wall = [1000.0]
            first = RedisThrottle(redis, key, clock=lambda: wall[0])
            second = RedisThrottle(redis, key, clock=lambda: wall[0])
            assert await second.blocked_for_s() == 0.0
            await first.block(30)
            await first.block(5)  # an earlier end does not shorten the hold
            assert await second.blocked_for_s() == pytest.approx(30, abs=0.01)
            clock = FakeClock()
            _answers(server)
            poster = JsonPoster(
                endpoint,
                timeout_s=5,
                retry=RetryPolicy(deadline_s=300),
                sleep=clock.sleep,
                throttle=second,
                clock=clock,
            )
            with recording_waits() as waits:
                await poster.post("chat/completions", headers={}, body=BODY, model="m")
            assert clock.delays == [pytest.approx(30, abs=0.01)]
            assert waits[0].shared and waits[0].status == 0
            assert 0 < await redis.pttl(key) <= 31_000

    asyncio.run(scenario())
