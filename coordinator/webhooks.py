"""Webhook delivery: the partitions' lifecycle events, posted to ``ORGA_WEBHOOKS``.

A :class:`WebhookDeliverer` runs next to each coordinator, as its own asyncio task: it reads
every ``orga:P:events`` stream in the consumer group ``orga-webhooks`` (so one event goes to
one deliverer), posts each event a subscription asked for (:mod:`shared.webhooks`: JSON,
signed), retries a post that fails (an error, a timeout, an answer other than 2xx) with
exponential back-off, and dead-letters it to the partition's dead-letter stream (``kind:
webhook``, the URL as :func:`public_url` shows it: no ``user:password@``, the path after its
first segment as ``/***`` (Slack's, Discord's token), its query as ``***``; never the secret)
once ``deadline_s`` has passed since the event. An error text (an HTTP library's message,
which may quote the URL in any form or echo a token) loses every URL's credentials and
token-like path segments, and every echo of the URL's password, hidden path segments,
credential-like query values and signing secret, before it is logged or dead-lettered. Every
field of an event (a failure's ``error``, an abort's ``reason``) is redacted with the
coordinator's redactor before it is
posted. The entry is acknowledged when every post of it was accepted or dead-lettered.

A receiver that hangs, or answers one byte at a time, costs one awaiting socket until
``timeout_s``: a total timeout over the whole post (connecting, sending, the answer's headers and
the first ``response_read_max`` bytes of its body, the rest discarded unread). The coordinator's
loop never waits for it, and the other posts go on: each post is its own asyncio task, at most
``concurrency`` at a time *per subscription* (a receiver that hangs holds its own slots, never
another's). At most ``max_in_flight`` entries are delivered at once: past that the deliverer
reads no new entries until some are done (they wait in the stream, not in memory). A deliverer
that dies leaves its entries pending in the group;
another (or itself, restarted) takes them over after ``claim_idle_ms`` (``XAUTOCLAIM``), so
deliveries survive a restart: at least once, with the same ``X-Orga-Delivery`` id each time,
for the receiver to drop a duplicate. A live deliverer keeps its entries from being taken over
by claiming them again (``XCLAIM``, ``claim_chunk`` ids per command) while it retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import httpx
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from coordinator.streams import read_group
from shared import keys
from shared.redaction import MIN_ECHO_CHARS, Redactor, redact_url, redact_urls, url_secrets
from shared.webhooks import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WebhookEvent,
    WebhookSubscription,
    sign,
    webhook_event,
)

__all__ = ["WebhookDeliverer", "public_url"]

log = logging.getLogger("orga.coordinator.webhooks")


@dataclass(frozen=True, slots=True)
class _Entry:
    """One lifecycle event to post: where it is (stream, id) and the JSON body."""

    stream: str
    entry_id: str
    body: dict[str, Any]


@dataclass
class WebhookDeliverer:
    """Posts the lifecycle events its subscriptions ask for; ``await run()``, ``stop()``."""

    redis: Redis
    subscriptions: list[WebhookSubscription]
    partitions: int = 1
    deadline_s: float = 3600.0
    timeout_s: float = 10.0
    first_backoff_s: float = 1.0
    max_backoff_s: float = 300.0
    claim_idle_ms: int = 60_000
    concurrency: int = 32
    """Posts in flight at once, per subscription."""
    max_in_flight: int = 1024
    """Entries being delivered at once; past it no new entries are read."""
    response_read_max: int = 4096
    """Bytes of a receiver's answer read at most (the rest is discarded unread)."""
    claim_chunk: int = 256
    """Entry ids per ``XCLAIM`` when this deliverer claims its own again."""
    block_ms: int = 1000
    transport: httpx.AsyncBaseTransport | None = None
    """The HTTP seam (tests may give an ``httpx.MockTransport``); None: the network."""
    redactor: Redactor = field(default_factory=lambda: Redactor(()))
    """The coordinator's (its settings' secrets): every field of a lifecycle event (a failure's
    ``error``, an abort's ``reason``) is redacted with it before it is posted to a receiver."""
    name: str = field(default_factory=lambda: f"webhooks-{uuid.uuid4().hex[:12]}")
    _stopping: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _in_flight: dict[tuple[str, str], asyncio.Task[None]] = field(default_factory=dict, init=False)
    _slots: list[asyncio.Semaphore] = field(init=False)
    _url_redactors: list[Redactor] = field(init=False)
    """Per subscription: its URL's password, token-like path segments (those :func:`public_url`
    hides) and credential-like query values, its secret."""

    def __post_init__(self) -> None:
        self._slots = [asyncio.Semaphore(self.concurrency) for _ in self.subscriptions]
        self._url_redactors = [
            Redactor(
                [
                    *url_secrets(str(s.url)),
                    *_hidden_path_secrets(str(s.url)),
                    *([s.secret.get_secret_value()] if s.secret else []),
                ]
            )
            for s in self.subscriptions
        ]

    @property
    def streams(self) -> list[str]:
        return keys.partition_streams(self.partitions, keys.events_stream)

    def stop(self) -> None:
        """Ask :meth:`run` to return (posts in flight stay pending, for a later deliverer)."""
        self._stopping.set()

    async def run(self) -> None:
        """Deliver until stopped."""
        await self._create_groups()
        async with httpx.AsyncClient(timeout=self.timeout_s, transport=self.transport) as http:
            last_claim = 0.0
            while not self._stopping.is_set():
                try:
                    if time.monotonic() - last_claim > self.claim_idle_ms / 3000:
                        await self._keep_and_take_over(http)
                        last_claim = time.monotonic()
                    if len(self._in_flight) < self.max_in_flight:
                        await self._read(http)
                    else:  # full: read nothing new until some deliveries end
                        await asyncio.sleep(min(self.block_ms, 100) / 1000)
                except RedisError as exc:  # Redis away or restarted: the coordinator waits too
                    await self._recover(exc)
            for task in list(self._in_flight.values()):
                task.cancel()
            await asyncio.gather(*self._in_flight.values(), return_exceptions=True)

    async def _recover(self, exc: RedisError) -> None:
        """After a Redis error: wait a little, and create the groups again if Redis lost them
        (restarted empty)."""
        error = f"{type(exc).__name__}: {redact_urls(str(exc))}"
        log.warning("webhook.redis_error", extra={"error": error})
        await asyncio.sleep(1.0)
        if "NOGROUP" in str(exc):
            with contextlib.suppress(RedisError):
                await self._create_groups()

    async def _create_groups(self) -> None:
        """The consumer group on every events stream, from now on (events written before
        the first deliverer started are not posted)."""
        for stream in self.streams:
            with contextlib.suppress(ResponseError):  # BUSYGROUP: it exists
                await self.redis.xgroup_create(stream, keys.webhook_group, id="$", mkstream=True)

    async def _read(self, http: httpx.AsyncClient) -> None:
        # one XREADGROUP on a Redis; one per partition's stream on a Redis Cluster
        room = max(1, min(64, self.max_in_flight - len(self._in_flight)))
        rows = await read_group(
            self.redis, keys.webhook_group, self.name, self.streams, count=room,
            block_ms=self.block_ms,
        )  # fmt: skip
        for stream, entries in rows:
            for entry_id, fields in entries:
                await self._start(http, stream, entry_id, fields)

    async def _keep_and_take_over(self, http: httpx.AsyncClient) -> None:
        """Claim again the entries this deliverer still retries (so none takes them over),
        and take over those another left pending for ``claim_idle_ms``."""
        for stream in self.streams:
            mine: list[Any] = [entry_id for (s, entry_id) in self._in_flight if s == stream]
            for at in range(0, len(mine), self.claim_chunk):
                chunk = mine[at : at + self.claim_chunk]
                await self.redis.xclaim(
                    stream, keys.webhook_group, self.name, 0, chunk, justid=True
                )
            room = self.max_in_flight - len(self._in_flight)
            if room <= 0:
                continue  # full: what others left pending waits for room
            reply = await self.redis.xautoclaim(
                stream, keys.webhook_group, self.name, self.claim_idle_ms, "0-0",
                count=min(100, room),
            )  # fmt: skip
            for entry_id, fields in cast("list[Any]", reply[1] if reply else []):
                await self._start(http, stream, _text(entry_id), fields)

    async def _start(
        self, http: httpx.AsyncClient, stream: str, entry_id: str, raw: dict[Any, Any] | None
    ) -> None:
        """Post an entry to every subscription asking for it, in its own task; acknowledge at
        once an entry nobody asked for."""
        if (stream, entry_id) in self._in_flight:
            return
        fields = {_text(k): _text(v) for k, v in (raw or {}).items()}
        kind = webhook_event(fields.get("event", ""))
        targets = [s for s in self.subscriptions if kind is not None and s.wants(kind)]
        if kind is None or not targets:
            await self.redis.xack(stream, keys.webhook_group, entry_id)
            return
        clean = {k: self.redactor.redact(v) for k, v in fields.items()}
        # the id names the partition too: stream ids are per stream, two partitions repeat them
        body = _payload(entry_id, kind, clean) | {"id": f"{self.streams.index(stream)}:{entry_id}"}
        entry = _Entry(stream, entry_id, body)
        self._in_flight[(stream, entry_id)] = asyncio.create_task(
            self._deliver(http, entry, targets)
        )

    async def _deliver(
        self, http: httpx.AsyncClient, entry: _Entry, targets: list[WebhookSubscription]
    ) -> None:
        try:
            await asyncio.gather(*(self._post_until_deadline(http, entry, s) for s in targets))
            await self.redis.xack(entry.stream, keys.webhook_group, entry.entry_id)
        finally:
            self._in_flight.pop((entry.stream, entry.entry_id), None)

    async def _post_until_deadline(
        self, http: httpx.AsyncClient, entry: _Entry, subscription: WebhookSubscription
    ) -> None:
        """Post until accepted, backing off; dead-letter past the deadline."""
        deadline = _entry_time(entry.entry_id) + self.deadline_s
        delivery = f"{entry.body['id']}:{self.subscriptions.index(subscription)}"
        attempt = 0
        while True:
            attempt += 1
            error = await self._post(http, subscription, delivery, entry.body)
            if error is None:
                return
            delay = min(self.first_backoff_s * 2 ** (attempt - 1), self.max_backoff_s)
            url = public_url(str(subscription.url))
            if time.time() + delay > deadline:
                await self._dead_letter(entry, url, attempt, error)
                return
            log.warning(
                "webhook.retry",
                extra={"url": url, "delivery": delivery, "attempt": attempt, "error": error,
                       "retry_in_s": delay},
            )  # fmt: skip
            await asyncio.sleep(delay)

    async def _post(
        self,
        http: httpx.AsyncClient,
        subscription: WebhookSubscription,
        delivery: str,
        body: dict[str, Any],
    ) -> str | None:
        """One post; None when accepted (2xx), else what went wrong (no secret in it)."""
        content = json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", "X-Orga-Event": body["event"],
                   "X-Orga-Delivery": delivery}  # fmt: skip
        if subscription.secret is not None:
            at = int(time.time())
            headers[TIMESTAMP_HEADER] = str(at)
            headers[SIGNATURE_HEADER] = sign(subscription.secret.get_secret_value(), at, content)
        url = str(subscription.url)
        async with self._slots[self.subscriptions.index(subscription)]:
            try:
                async with asyncio.timeout(self.timeout_s):  # the whole post, not one read
                    status = await self._send(http, url, content, headers)
            except TimeoutError:
                return f"not answered in full within {self.timeout_s:g}s"
            except httpx.HTTPError as exc:  # its text may quote the URL: shown without secrets
                return f"{type(exc).__name__}: {self._clean(subscription, str(exc))[:200]}"
        if 200 <= status < 300:
            return None
        return f"HTTP {status}"

    def _clean(self, subscription: WebhookSubscription, text: str) -> str:
        """``text`` with every URL in it redacted and every echo of ``subscription``'s URL
        credentials (password, credential-like query values) and secret, and of the
        coordinator's own secrets, replaced."""
        redactor = self._url_redactors[self.subscriptions.index(subscription)]
        return self.redactor.redact(redactor.redact(redact_urls(text)))

    async def _send(
        self, http: httpx.AsyncClient, url: str, content: bytes, headers: dict[str, str]
    ) -> int:
        """Post, read at most ``response_read_max`` bytes of the answer; its status."""
        async with http.stream("POST", url, content=content, headers=headers) as response:
            read = 0
            async for chunk in response.aiter_bytes():
                read += len(chunk)
                if read >= self.response_read_max:
                    break  # the rest is discarded: the connection is closed, not drained
            return response.status_code

    async def _dead_letter(self, entry: _Entry, url: str, attempts: int, error: str) -> None:
        stream, entry_id, body = entry.stream, entry.entry_id, entry.body
        partition = self.streams.index(stream)
        log.error(
            "webhook.dead_lettered",
            extra={"url": url, "entry_id": entry_id, "attempts": attempts, "error": error},
        )
        await self.redis.xadd(
            keys.dead_letter_stream(partition),
            {"kind": "webhook", "url": url, "event": body["event"], "entry_id": entry_id,
             "task_id": body.get("task_id") or "", "attempts": str(attempts),
             "error": f"not accepted within {self.deadline_s:g}s of the event: {error}"},
            maxlen=keys.dead_letter_maxlen, approximate=True,
        )  # fmt: skip


def _payload(entry_id: str, kind: WebhookEvent, fields: dict[str, str]) -> dict[str, Any]:
    """The JSON posted: the webhook event, its task, when, and the lifecycle event's fields."""
    return {
        "id": entry_id,
        "event": kind,
        "task_id": fields.get("task_id"),
        "at": float(fields.get("at") or _entry_time(entry_id)),
        "lifecycle_event": fields.get("event"),
        "data": {k: v for k, v in fields.items() if k not in ("task_id", "event", "at")},
    }


def public_url(url: str) -> str:
    """A webhook URL as logs and dead letters show it: :func:`shared.redaction.redact_url`
    (no user or password, the query as ``***``, no fragment) keeping the scheme, the host and
    at most the first path segment, the rest as ``/***``: Slack's and Discord's webhook URLs
    carry their token in the path (``/services/T…/B…/<token>``, ``/api/webhooks/<id>/<token>``).
    The cost: two subscriptions on one host and first segment look alike in a dead letter
    (its ``event`` and ``entry_id`` still tell them apart)."""
    return redact_url(url, path_segments=1)


def _hidden_path_secrets(url: str) -> list[str]:
    """The path segments :func:`public_url` hides, of at least ``MIN_ECHO_CHARS``
    characters (a token), each as written and decoded: an error text's echo of them is
    redacted."""
    try:
        segments = [s for s in urlsplit(url).path.split("/") if s][1:]
    except ValueError:
        return []
    long = [s for s in segments if len(s) >= MIN_ECHO_CHARS]
    return [*long, *(unquote(s) for s in long)]


def _entry_time(entry_id: str) -> float:
    """When a stream entry was written (its id's milliseconds), in unix seconds."""
    return int(entry_id.partition("-")[0]) / 1000


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
