"""The webhook deliverer on a real Redis (consumer groups, pending entries, XAUTOCLAIM), with
the receiver behind httpx's MockTransport: retries, dead letters, and a delivery taken over
from a deliverer that stopped mid-retry."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from redis.asyncio import Redis

from coordinator.webhooks import WebhookDeliverer, public_url
from shared import keys
from shared.redaction import REDACTED, Redactor
from shared.webhooks import WebhookSubscription
from tests.redis_server import RedisClientFactory

EVENTS = keys.events_stream(0)


def _hook(url: str = "https://hooks.example/in?token=abc", **extra: object) -> WebhookSubscription:
    return WebhookSubscription.model_validate({"url": url, **extra})


def _receiver(statuses: list[int], seen: list[httpx.Request]) -> httpx.MockTransport:
    """Answers each post with the next status (the last one repeated)."""

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(statuses[min(len(seen), len(statuses)) - 1])

    return httpx.MockTransport(handle)


async def _started(deliverer: WebhookDeliverer) -> asyncio.Task[None]:
    task = asyncio.create_task(deliverer.run())
    while not await deliverer.redis.exists(EVENTS):  # its group is created with the stream
        await asyncio.sleep(0.01)
    return task


async def _until(predicate: object, timeout_s: float = 10.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("timed out")


async def _pending(redis: Redis) -> int:
    return int((await redis.xpending(EVENTS, keys.webhook_group))["pending"])


def test_a_failing_post_is_retried_with_backoff_then_acknowledged(
    redis_client: RedisClientFactory,
) -> None:
    """503, 503, 200: three posts of one delivery, the gaps growing (0.1 s, 0.2 s), then the
    entry acknowledged; an event nobody subscribed to is acknowledged without a post."""

    async def scenario() -> None:
        seen: list[httpx.Request] = []
        async with redis_client() as redis:
            deliverer = WebhookDeliverer(redis, [_hook(events=["task_finished"])],
                                         first_backoff_s=0.1, block_ms=50,
                                         transport=_receiver([503, 503, 200], seen))  # fmt: skip
            task = await _started(deliverer)
            await redis.xadd(EVENTS, {"task_id": "t1", "event": "step_started", "at": "1"})
            await redis.xadd(EVENTS, {"task_id": "t1", "event": "completed", "at": "2"})
            await _until(lambda: _done(redis, seen, 3))
            deliverer.stop()
            await task
        assert len({r.headers["X-Orga-Delivery"] for r in seen}) == 1
        body = json.loads(seen[0].content)
        assert body["event"] == "task_finished" and body["task_id"] == "t1"
        assert "X-Orga-Signature" not in seen[0].headers  # no secret: unsigned

    async def _done(redis: Redis, seen: list[httpx.Request], posts: int) -> bool:
        return len(seen) == posts and await _pending(redis) == 0

    asyncio.run(scenario())


def test_past_the_deadline_a_post_is_dead_lettered_without_credentials(
    redis_client: RedisClientFactory,
) -> None:
    """A receiver that always answers 503: the post is dead-lettered once the next retry
    would pass the deadline, with the URL stripped of its query and no secret."""

    async def scenario() -> dict[str, str]:
        seen: list[httpx.Request] = []
        async with redis_client(decode_responses=True) as redis:
            hook = _hook(secret="s3cret-value")
            deliverer = WebhookDeliverer(redis, [hook], deadline_s=0.5, first_backoff_s=0.1,
                                         block_ms=50, transport=_receiver([503], seen))  # fmt: skip
            task = await _started(deliverer)
            await redis.xadd(EVENTS, {"task_id": "t2", "event": "failed", "error": "boom"})
            dead = keys.dead_letter_stream(0)
            await _until(lambda: redis.xlen(dead))
            deliverer.stop()
            await task
            assert await _pending(redis) == 0
            assert seen[0].headers["X-Orga-Signature"].startswith("sha256=")
            return dict((await redis.xrange(dead))[0][1])

    letter = asyncio.run(scenario())
    assert letter["kind"] == "webhook" and letter["event"] == "task_failed"
    assert (
        letter["url"]
        == "https://hooks.example/in"
        == public_url("https://u:p@hooks.example/in?token=abc")
    )
    assert "HTTP 503" in letter["error"] and int(letter["attempts"]) >= 2
    assert "s3cret" not in json.dumps(letter) and "token=abc" not in json.dumps(letter)


def test_an_events_error_and_reason_are_redacted_before_they_are_posted(
    redis_client: RedisClientFactory,
) -> None:
    """A failure's ``error`` and ``reason`` that echo a secret of the coordinator's settings
    reach the receiver (a third party) redacted."""
    secret = "sk-webhook-redaction-0123456789abcdef"

    async def scenario() -> list[httpx.Request]:
        seen: list[httpx.Request] = []
        async with redis_client() as redis:
            deliverer = WebhookDeliverer(redis, [_hook()], block_ms=50,
                                         transport=_receiver([200], seen),
                                         redactor=Redactor([secret]))  # fmt: skip
            task = await _started(deliverer)
            fields = {"task_id": "t4", "event": "failed", "error": f"401 for key {secret}",
                      "reason": f"the key {secret} was refused"}  # fmt: skip
            await redis.xadd(EVENTS, fields)
            await _until(lambda: _posted(redis, seen))
            deliverer.stop()
            await task
        return seen

    async def _posted(redis: Redis, seen: list[httpx.Request]) -> bool:
        return len(seen) == 1 and await _pending(redis) == 0

    (request,) = asyncio.run(scenario())
    body = json.loads(request.content)
    assert secret not in request.content.decode()
    assert body["data"]["error"] == f"401 for key {REDACTED}"
    assert body["data"]["reason"] == f"the key {REDACTED} was refused"


def test_a_delivery_survives_its_deliverer_stopping_mid_retry(
    redis_client: RedisClientFactory,
) -> None:
    """The first deliverer gets 500 and stops while it backs off (its entry stays pending in
    the group); another, started later, takes the entry over and delivers it, with the same
    delivery id."""

    async def scenario() -> None:
        first_seen: list[httpx.Request] = []
        second_seen: list[httpx.Request] = []
        async with redis_client() as redis:
            first = WebhookDeliverer(redis, [_hook()], first_backoff_s=30, block_ms=50,
                                     transport=_receiver([500], first_seen))  # fmt: skip
            running = await _started(first)
            await redis.xadd(EVENTS, {"task_id": "t3", "event": "escalated", "review_id": "r"})

            async def posted() -> bool:
                return bool(first_seen)

            await _until(posted)
            first.stop()
            await running
            assert await _pending(redis) == 1
            second = WebhookDeliverer(redis, [_hook()], claim_idle_ms=200, block_ms=50,
                                      transport=_receiver([200], second_seen))  # fmt: skip
            running = asyncio.create_task(second.run())

            async def delivered() -> bool:
                return bool(second_seen) and await _pending(redis) == 0

            await _until(delivered)
            second.stop()
            await running
        assert first_seen[0].headers["X-Orga-Delivery"] == second_seen[0].headers["X-Orga-Delivery"]
        assert json.loads(second_seen[0].content)["event"] == "review_opened"

    asyncio.run(scenario())


def test_a_deliverer_outlives_redis_losing_its_group(redis_client: RedisClientFactory) -> None:
    """Redis restarted empty (FLUSHALL here): the deliverer's reads fail with NOGROUP, it
    creates its groups again, and the events written after are posted."""

    async def scenario() -> None:
        seen: list[httpx.Request] = []
        async with redis_client() as redis:
            deliverer = WebhookDeliverer(redis, [_hook()], block_ms=50,
                                         transport=_receiver([200], seen))  # fmt: skip
            running = await _started(deliverer)
            await redis.flushall()

            async def regrouped() -> bool:
                return bool(await redis.exists(EVENTS))

            await _until(regrouped)
            await redis.xadd(EVENTS, {"task_id": "t4", "event": "completed"})

            async def posted() -> bool:
                return bool(seen)

            await _until(posted)
            deliverer.stop()
            await running
        assert json.loads(seen[0].content)["task_id"] == "t4"

    asyncio.run(scenario())
