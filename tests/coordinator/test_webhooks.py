"""The webhook deliverer on a real Redis (consumer groups, pending entries, XAUTOCLAIM), with
the receiver behind httpx's MockTransport: retries, dead letters, and a delivery taken over
from a deliverer that stopped mid-retry."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import httpx
import pytest
from redis.asyncio import Redis

from coordinator.logs import EventFormatter
from coordinator.webhooks import WebhookDeliverer, public_url
from shared import keys
from shared.redaction import REDACTED, Redactor, redact_url, redact_urls, url_secrets
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


async def _dead_letter_of(deliverer: WebhookDeliverer, fields: dict[str, str]) -> dict[str, str]:
    """Run ``deliverer``, write one event of ``fields``, wait for its dead letter, stop; the
    dead letter (the deliverer's Redis decodes its replies)."""
    task = await _started(deliverer)
    await deliverer.redis.xadd(EVENTS, {**fields, "error": "boom"})
    dead = keys.dead_letter_stream(0)
    await _until(lambda: deliverer.redis.xlen(dead))
    deliverer.stop()
    await task
    return dict((await deliverer.redis.xrange(dead))[0][1])


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
            letter = await _dead_letter_of(deliverer, {"task_id": "t2", "event": "failed"})
            assert await _pending(redis) == 0
            assert seen[0].headers["X-Orga-Signature"].startswith("sha256=")
            return letter

    letter = asyncio.run(scenario())
    assert letter["kind"] == "webhook" and letter["event"] == "task_failed"
    assert (
        letter["url"]
        == "https://hooks.example/in?***"
        == public_url("https://u:p@hooks.example/in?token=abc#f")
    )
    assert "HTTP 503" in letter["error"] and int(letter["attempts"]) >= 2
    assert "s3cret" not in json.dumps(letter) and "token=abc" not in json.dumps(letter)


def test_a_webhook_urls_credentials_never_reach_the_log_records(
    redis_client: RedisClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A subscription whose URL carries a password (userinfo) and a token (query), and whose
    receiver fails with an HTTP error quoting the URL in another form (a redirect's target)
    and echoing the token bare: neither the retry nor the dead-letter log records, nor the
    dead letter, hold the password or the token."""
    password, token = "pw-s3cret-0123456789", "tok-s3cret-0123456789"
    url = f"https://user:{password}@hooks.example/in?token={token}&x=1"

    def refuse(request: httpx.Request) -> httpx.Response:
        moved = request.url.copy_with(path="/moved")
        raise httpx.ConnectError(f"redirected to {moved}, then refused (token {token})")

    async def scenario() -> dict[str, str]:
        async with redis_client(decode_responses=True) as redis:
            deliverer = WebhookDeliverer(redis, [_hook(url)], deadline_s=0.5,
                                         first_backoff_s=0.1, block_ms=50,
                                         transport=httpx.MockTransport(refuse))  # fmt: skip
            return await _dead_letter_of(deliverer, {"task_id": "t3", "event": "failed"})

    with caplog.at_level(logging.DEBUG, logger="orga.coordinator.webhooks"):
        letter = asyncio.run(scenario())
    records = [r for r in caplog.records if r.name == "orga.coordinator.webhooks"]
    events = {r.getMessage() for r in records}
    assert {"webhook.retry", "webhook.dead_lettered"} <= events
    for record in records:
        line = EventFormatter("%(message)s").format(record)
        assert "hooks.example/in?***" in line and "ConnectError" in line
        assert password not in line and token not in line and "s3cret" not in line
    assert "s3cret" not in json.dumps(letter)


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


class _Receivers:
    """A real local HTTP server (asyncio, raw sockets): ``/drip`` answers 200 then its body
        one byte every 0.1 s for a minute; ``/big`` answers 200 and the first 64 KiB of a 1 GB body,
    then nothing; ``/hang`` never answers; anything else 204 at once.
        Each request's path, as it arrived, in ``seen``."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, float]] = []
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> _Receivers:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            path = head.split(" ", 2)[1]
            length = next((int(line.split(":", 1)[1]) for line in head.split("\r\n")
                           if line.lower().startswith("content-length:")), 0)  # fmt: skip
            await reader.readexactly(length)
            self.seen.append((path, time.monotonic()))
            if path.startswith("/hang"):
                await asyncio.sleep(60)
            elif path.startswith("/big"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n")
                writer.write(b"x" * 65536)
                await writer.drain()
                await asyncio.sleep(60)
            elif path.startswith("/drip"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 600\r\n\r\n")
                for _ in range(600):
                    writer.write(b".")
                    await writer.drain()
                    await asyncio.sleep(0.1)
            else:
                writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


def test_a_dripping_receiver_is_cut_at_the_timeout_and_retried(
    redis_client: RedisClientFactory,
) -> None:
    """A receiver answering one byte every 0.1 s (each read well within ``timeout_s``): the
    post is cut ``timeout_s`` after it started, and retried."""

    async def scenario() -> list[float]:
        async with redis_client() as redis, _Receivers() as receivers:
            deliverer = WebhookDeliverer(redis, [_hook(f"{receivers.url}/drip")], timeout_s=0.5,
                                         first_backoff_s=0.1, block_ms=50)  # fmt: skip
            task = await _started(deliverer)
            await redis.xadd(EVENTS, {"task_id": "t5", "event": "completed"})

            async def retried() -> bool:
                return len(receivers.seen) >= 2

            try:
                await _until(retried, timeout_s=8)
            finally:
                deliverer.stop()
                await task
            return [at for _, at in receivers.seen]

    first, second, *_ = asyncio.run(scenario())
    assert 0.5 <= second - first < 3, second - first  # cut at 0.5 s, retried 0.1 s later


def test_a_hanging_receiver_does_not_delay_another_subscriptions_deliveries(
    redis_client: RedisClientFactory,
) -> None:
    """Two subscriptions, two posts in flight each: one receiver never answers (its posts wait
    out a long timeout), the other gets every event at once."""

    async def scenario() -> None:
        async with redis_client() as redis, _Receivers() as receivers:
            hooks = [_hook(f"{receivers.url}/hang"), _hook(f"{receivers.url}/ok")]
            deliverer = WebhookDeliverer(redis, hooks, timeout_s=30, concurrency=2, block_ms=50)
            task = await _started(deliverer)
            for number in range(6):
                await redis.xadd(EVENTS, {"task_id": f"t{number}", "event": "completed"})

            async def all_at_ok() -> bool:
                return len([p for p, _ in receivers.seen if p == "/ok"]) == 6

            try:
                await _until(all_at_ok, timeout_s=5)
            finally:
                deliverer.stop()
                await task
            assert len([p for p, _ in receivers.seen if p == "/hang"]) == 2  # its own 2 slots

    asyncio.run(scenario())


def test_the_entries_in_flight_are_bounded(redis_client: RedisClientFactory) -> None:
    """A receiver that never answers: the deliverer reads at most ``max_in_flight`` entries;
    the others wait in the stream, unread (no growing memory)."""

    async def scenario() -> None:
        async with redis_client() as redis, _Receivers() as receivers:
            deliverer = WebhookDeliverer(redis, [_hook(f"{receivers.url}/hang")], timeout_s=30,
                                         max_in_flight=3, block_ms=50)  # fmt: skip
            task = await _started(deliverer)
            for number in range(10):
                await redis.xadd(EVENTS, {"task_id": f"t{number}", "event": "completed"})

            async def three() -> bool:
                return len(receivers.seen) >= 3

            try:
                await _until(three)
                await asyncio.sleep(0.5)
                assert len(receivers.seen) == 3 and await _pending(redis) == 3
            finally:
                deliverer.stop()
                await task

    asyncio.run(scenario())


def test_a_receivers_answer_is_read_only_so_far(redis_client: RedisClientFactory) -> None:
    """A receiver accepting with a 1 GB body it sends slowly: the deliverer reads a few KB of
    it, takes the 200 and acknowledges the entry, without waiting for (or keeping) the rest."""

    async def scenario() -> None:
        async with redis_client() as redis, _Receivers() as receivers:
            deliverer = WebhookDeliverer(redis, [_hook(f"{receivers.url}/big")], timeout_s=5,
                                         first_backoff_s=0.1, block_ms=50)  # fmt: skip
            task = await _started(deliverer)
            await redis.xadd(EVENTS, {"task_id": "t6", "event": "completed"})

            async def acknowledged() -> bool:
                return bool(receivers.seen) and await _pending(redis) == 0

            try:
                await _until(acknowledged, timeout_s=3)  # before the 5 s timeout
            finally:
                deliverer.stop()
                await task
            assert len(receivers.seen) == 1

    asyncio.run(scenario())


def test_a_deliverer_keeps_all_its_entries_claiming_them_by_chunks(
    redis_client: RedisClientFactory,
) -> None:
    """Five entries in flight (their receiver hangs), claimed again two ids per ``XCLAIM``
    every third of ``claim_idle_ms``: every one stays this deliverer's and never idles longer
    than that third (and a little), so none can be taken over from a live deliverer."""

    async def scenario() -> list[int]:
        async with redis_client() as redis, _Receivers() as receivers:
            hang = _hook(f"{receivers.url}/hang")
            deliverer = WebhookDeliverer(redis, [hang], timeout_s=30, claim_idle_ms=1500,
                                         claim_chunk=2, block_ms=50)  # fmt: skip
            task = await _started(deliverer)
            for number in range(5):
                await redis.xadd(EVENTS, {"task_id": f"t{number}", "event": "completed"})

            async def five() -> bool:
                return len(receivers.seen) == 5

            idles: list[int] = []
            try:
                await _until(five)
                for _ in range(30):  # 3 s: past claim_idle_ms, a claim missed would show
                    rows = await redis.xpending_range(EVENTS, keys.webhook_group, "-", "+", 10)
                    assert len(rows) == 5
                    assert {_name(r["consumer"]) for r in rows} == {deliverer.name}
                    idles.append(max(int(r["time_since_delivered"]) for r in rows))
                    await asyncio.sleep(0.1)
            finally:
                deliverer.stop()
                await task
            return idles

    idles = asyncio.run(scenario())
    assert max(idles) < 1000, idles  # claimed every 0.5 s; XAUTOCLAIM alone: up to 1.5 s


def _name(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def test_two_partitions_events_with_the_same_stream_id_get_distinct_delivery_ids(
    redis_client: RedisClientFactory,
) -> None:
    """Each partition has its own events stream, so two entries can share a stream id: the
    body's id and X-Orga-Delivery name the partition, so a receiver dropping duplicates by them
    keeps both events."""

    async def scenario() -> None:
        seen: list[httpx.Request] = []
        async with redis_client() as redis:
            deliverer = WebhookDeliverer(redis, [_hook()], partitions=2, block_ms=50,
                                         transport=_receiver([200], seen))  # fmt: skip
            task = asyncio.create_task(deliverer.run())
            for p in (0, 1):
                while not await redis.exists(keys.events_stream(p)):
                    await asyncio.sleep(0.01)
            for p in (0, 1):  # the same explicit id in both partitions' streams
                await redis.xadd(keys.events_stream(p),
                                 {"task_id": f"t{p}", "event": "completed", "at": "1"},
                                 id="9999999999999-0")  # fmt: skip
            await _until(lambda: _posted(seen, 2))
            deliverer.stop()
            await task
        bodies = {json.loads(r.content)["task_id"]: r for r in seen}
        assert json.loads(bodies["t0"].content)["id"] == "0:9999999999999-0"
        assert json.loads(bodies["t1"].content)["id"] == "1:9999999999999-0"
        assert bodies["t0"].headers["X-Orga-Delivery"] == "0:9999999999999-0:0"
        assert bodies["t1"].headers["X-Orga-Delivery"] == "1:9999999999999-0:0"

    async def _posted(seen: list[httpx.Request], posts: int) -> bool:
        return len(seen) >= posts

    asyncio.run(scenario())


WEBHOOK_TOKEN = "XyZsecretTOKEN123456"


@pytest.mark.parametrize(
    "url",
    [
        f"https://hooks.slack.com/services/T0AAAA/B0BBBB/{WEBHOOK_TOKEN}",
        f"https://discord.com/api/webhooks/123456/{WEBHOOK_TOKEN}",
    ],
)
def test_a_webhook_token_in_the_url_path_is_not_shown(url: str) -> None:
    """Slack's and Discord's webhook URLs carry their token in the path: the public form keeps
    the scheme, the host and the first path segment; an error text quoting the URL loses the
    token too; the deliverer's redactor knows the hidden segments."""
    assert WEBHOOK_TOKEN not in public_url(url)
    assert public_url(url).endswith(".com/services/***") or public_url(url).endswith("/api/***")
    assert WEBHOOK_TOKEN not in redact_urls(
        f"ClientResponseError: 404, message='Not Found', url='{url}'"
    )
    deliverer = WebhookDeliverer(redis=None, subscriptions=[_hook(url)])  # type: ignore[arg-type]
    cleaned = deliverer._clean(deliverer.subscriptions[0], f"bad token {WEBHOOK_TOKEN.lower()}")
    assert WEBHOOK_TOKEN.lower() not in cleaned.lower()


def test_a_telegram_bot_token_in_the_first_path_segment_is_hidden() -> None:
    """Telegram's bot API (a webhook target) carries its token as ``/bot<id>:<secret>/``: the
    ``:`` is outside the token class, so redact_url and public_url (which keeps the first
    segment) show it whole in logs and dead letters, and url_secrets does not list it."""
    secret = "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
    url = f"https://api.telegram.org/bot123456789:{secret}/sendMessage"
    assert secret not in redact_url(url)
    assert secret not in public_url(url)
    assert any(secret in s for s in url_secrets(url))
