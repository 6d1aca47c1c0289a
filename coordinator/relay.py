"""The outbox relay: dispatches committed to ``orga:outbox`` are sent to Celery, then removed.

Every commit that dispatches work appends it to the outbox stream in the same atomic Redis
operation as the state awaiting it (the coordinator's commit script; a reasoning worker's
publish of the tool calls it chains, with its observation). A relay runs in each coordinator
process (:meth:`coordinator.service.Coordinator.run`) and serves the outboxes of the partitions
whose lease its coordinator holds (:mod:`coordinator.partition_leases`). It reads every entry
still on them (``XREAD`` from ``0-0``, in batches, blocking while there are none), sends each
through Celery's own API (:class:`CeleryPublisher`: ``Celery.send_task`` on one producer per
batch; no message layout written here), then deletes the batch (one ``XDEL``).

The outbox itself is the list of dispatches not yet sent: an entry leaves it only once sent,
so there is no consumer group and no pending list to keep (one ``XREADGROUP``, one script
with its ``XACK`` and ``XDEL``, and an ``XAUTOCLAIM`` a second per partition before issue 27;
one ``XREAD`` and one ``XDEL`` now). The partition lease is what keeps two relays off one
outbox: a handover overlaps no read (a drained partition's lease is released only once the
relay has started a new round, :meth:`PartitionLeases.serving`), and a coordinator paused
past its lease stops serving before, or as, another takes over.

Delivery is at least once. A relay killed between the send and the removal leaves its entries
on the outbox; the next relay to serve the partition (the coordinator that takes its lease, or
the same one restarted) reads them first and sends them again, with the same Celery task id.
The fences make the second copy harmless: its observation carries the iteration and attempt
already applied and is ignored, and a tool that must apply once replays its kept result
(:mod:`workers.applied_calls`). A send that fails (the broker unreachable) removes what went
out and leaves the rest on the outbox, in front of anything newer: the relay reads them first
again after a back-off. A relay whose lease lapses during a blocking read (at most
``block_ms``) may send what it read while the new holder reads it too: two copies, as above.

The send is blocking (kombu's producer). By default it runs on the event loop, ``loop_chunk``
(8) entries at a time with the loop let run between chunks (about 0.3 ms of CPU and one
``LPUSH`` round trip per entry): in the relay's own thread (``in_thread``) each of kombu's
socket operations gave the GIL back and waited for it behind the coordinator's busy loop, and
in ``bench/slow_model_bench.py`` the 200 first dispatches of a burst then reached the model
0.7 s later than on the loop (docs/performance.md, "The transactional outbox").

Everything that moves bytes to the broker is behind the one-method
:class:`~coordinator.transport.Transport`: tests give the relay a transport of their own, the
coordinator never imports worker code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from celery import Celery
from redis.asyncio import Redis

from coordinator.streams import read_streams
from coordinator.transport import PublishError, Transport
from shared import keys
from shared.errors import ConfigError
from shared.outbox import OutboxEntry, OutboxEntryError
from shared.settings import OrgaSettings, celery_broker_url, celery_config

__all__ = ["CeleryPublisher", "OutboxRelay", "PublishError"]

log = logging.getLogger("orga.coordinator.relay")


class CeleryPublisher:
    """``Celery.send_task`` for each entry, on one producer (one broker connection) per batch.

    The app is a client only: it declares the queues and routes of the workers' configuration
    (:func:`shared.settings.celery_config`, JSON only) and imports no task.

    With ``broker_depths`` (a broker other than the state Redis, Redis or RabbitMQ; any broker
    for the Prometheus queue gauge), it also tells how deep the queues are
    (:class:`~coordinator.transport.QueueDepths`): kombu's ``Channel.queue_declare(passive=True)``,
    whose reply counts the messages ready (AMQP's ``declare-ok``; the lists' lengths on kombu's
    Redis transport), on a connection of its own.
    """

    def __init__(self, app: Celery, broker_depths: bool = False) -> None:
        self.app = app
        self.broker_depths = broker_depths
        self._depths_lock = threading.Lock()
        self._depths_connection: Any = None
        """A ``kombu.Connection`` (untyped) to the broker, for :meth:`queue_depths` only."""
        self._routes: dict[tuple[str, str], dict[str, Any]] = {}

    def _route(self, task: str, queue: str) -> dict[str, Any]:
        """The options Celery's router gives task ``task`` sent to ``queue`` (the queue's kombu
        ``Queue``, and the exchange and routing key of a route that names them), worked out on
        the first dispatch of that pair; a copy, since a send may add to it."""
        routed = self._routes.get((task, queue))
        if routed is None:
            routed = self._routes[(task, queue)] = self.app.amqp.router.route(
                {"queue": queue}, task, [], {}, None
            )
        return dict(routed)

    @classmethod
    def from_settings(
        cls, settings: OrgaSettings, broker_depths: bool | None = None
    ) -> CeleryPublisher:
        """A publisher to the workers' broker: ``settings.broker_url``, else ``redis_url``.
        ``broker_depths``: whether :meth:`queue_depths` asks the broker (None: only when it is
        not the state Redis, whose lists the coordinator's queue gauge reads itself; True for
        the Prometheus queue gauge, which asks the broker whichever it is)."""
        if settings.redis_url is None:
            raise ConfigError(
                "ORGA_REDIS_URL is not set: the coordinator's relay sends dispatches to the "
                "Celery broker on the Redis it uses (e.g. ORGA_REDIS_URL=redis://127.0.0.1:6379/0)"
            )
        app = Celery("orga-relay", set_as_current=False)
        app.conf.update(celery_config(settings, celery_broker_url(settings)))
        if broker_depths is None:
            broker_depths = settings.broker_url not in (None, settings.redis_url)
        return cls(app, broker_depths=broker_depths)

    def queue_depths(self, queues: Sequence[str]) -> Mapping[str, int] | None:
        """Messages ready in each queue on the broker (a queue not declared yet: 0); None on
        the state Redis's own broker (its lists are read there)."""
        if not self.broker_depths:
            return None
        with self._depths_lock:
            if self._depths_connection is None:
                self._depths_connection = self.app.connection_for_read()
            connection: Any = self._depths_connection
            try:
                connection.ensure_connection(max_retries=1)
                return {queue: _ready(connection, queue) for queue in queues}
            except Exception:
                self._depths_connection = None  # a new connection next time
                connection.release()
                raise

    def publish(self, entries: Sequence[OutboxEntry]) -> None:
        """Send each entry as task ``entry.task`` with the one argument ``entry.payload``.

        The message is the one ``Celery.send_task`` would send for it (the same headers,
        properties and body: ``tests/coordinator/test_transport.py``), built with the two
        public calls ``send_task`` makes itself, ``app.amqp.create_task_message`` and
        ``app.amqp.send_task_message``, with the route of each (task, queue)
        (``app.amqp.router``) worked out on its first dispatch instead of at every one. What
        ``send_task`` does besides, for callers this relay never is, is left out: the task
        registry's options (the relay's app registers no task), a parent task's ids (it runs
        in no worker), the result backend's ``on_task_call`` (there is none: ``result_backend``
        is None) and the ``AsyncResult`` it returns."""
        app = self.app
        amqp = app.amqp
        reply_to = app.thread_oid  # what send_task puts there: this app's oid in this thread
        sent_event = app.conf.task_send_sent_event
        with app.producer_or_acquire() as producer:
            for index, entry in enumerate(entries):
                try:
                    options = self._route(entry.task, entry.queue)
                    message = amqp.create_task_message(
                        entry.id,
                        entry.task,
                        [entry.payload],
                        {},
                        reply_to=reply_to,
                        create_sent_event=sent_event,
                        shadow=entry.shadow,
                        argsrepr=entry.argsrepr,
                        kwargsrepr="{}",
                        ignore_result=None,
                        **options,
                    )
                    amqp.send_task_message(
                        producer,
                        entry.task,
                        message,
                        argsrepr=entry.argsrepr,  # as send_task passes them: message properties
                        kwargsrepr="{}",
                        declare=[],  # the queue's list is named after it; workers declare
                        **options,
                    )
                except Exception as exc:
                    raise PublishError(
                        f"sending {entry.task} {entry.id} to {entry.queue} failed: "
                        f"{type(exc).__name__}: {exc}",
                        sent=index,
                    ) from exc

    def close(self) -> None:
        """Release the broker connections."""
        with self._depths_lock:
            if self._depths_connection is not None:
                self._depths_connection.release()
                self._depths_connection = None
        self.app.close()


def _ready(connection: Any, queue: str) -> int:
    """Messages ready in ``queue`` (passive declare, on a channel of its own: a broker closes
    the channel of a declare that names no queue); 0 when the queue does not exist yet."""
    channel = connection.channel()
    try:
        return int(channel.queue_declare(queue=queue, passive=True).message_count)
    except connection.channel_errors:
        return 0
    finally:
        with contextlib.suppress(*connection.connection_errors, *connection.channel_errors):
            channel.close()


@dataclass
class OutboxRelay:
    """One relay (``name``, for its logs) of the outboxes of the partitions served."""

    redis: Redis
    publisher: Transport
    name: str
    batch: int = keys.outbox_batch
    partitions: int = 1
    """The deployment's partition count."""
    serving: Callable[[], Collection[int]] | None = None
    """The partitions whose outbox this relay reads, asked at the start of each
    :meth:`relay_once` (the coordinator's partition leases); None: every partition."""
    block_ms: int = 1000
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    in_thread: bool = False
    loop_chunk: int = 8
    _thread: ThreadPoolExecutor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orga-relay")
        self._streams = {keys.outbox_stream(p): p for p in range(self.partitions)}
        self._served: list[str] = list(self._streams)

    def _outboxes(self) -> list[str]:
        """The outbox streams of the partitions served now."""
        if self.serving is None:
            return list(self._streams)
        return [keys.outbox_stream(p) for p in sorted(self.serving())]

    async def run(self, stopping: asyncio.Event) -> None:
        """Relay until ``stopping`` is set; a failure backs off (Redis or the broker down)."""
        failures = 0
        try:
            while not stopping.is_set():
                try:
                    await self.relay_once()
                    failures = 0
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    failures += 1
                    delay_s = min(self.backoff_s * 2 ** min(failures - 1, 10), self.max_backoff_s)
                    log.warning(
                        "relay.failed",
                        extra={"relay": self.name, "error": str(exc)[:300], "retry_in_s": delay_s},
                    )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stopping.wait(), delay_s)
        finally:
            await self.close()

    async def relay_once(self) -> int:
        """Send one batch of the outboxes served and remove what was sent; how many were sent.
        The oldest entries come first: a failed send's rest, a dead relay's, then new ones
        (waiting up to ``block_ms`` for one when the outboxes are empty)."""
        self._served = self._outboxes()
        sent = 0
        for stream, rows in await self.read():
            sent += await self.send(rows, stream)
        return sent

    async def read(self) -> list[tuple[str, list[tuple[str, dict[Any, Any]]]]]:
        """Up to ``batch`` entries still on each outbox served, oldest first (``XREAD`` from
        ``0-0``), by stream."""
        if not self._served:  # no partition served: wait as a blocking read would
            await asyncio.sleep(self.block_ms / 1000)
            return []
        return await read_streams(
            self.redis, self._served, start="0-0", count=self.batch, block_ms=self.block_ms
        )

    async def send(self, rows: Sequence[tuple[str, dict[Any, Any]]], stream: str) -> int:
        """Publish ``rows`` (of the outbox ``stream``) and remove those sent; raises
        PublishError after removing the ones that went out before the failure (the rest stay
        on the outbox, the first ones the next read returns)."""
        if not rows:
            return 0
        entries, sendable, malformed = [], [], []
        for entry_id, fields in rows:
            try:
                entries.append(OutboxEntry.from_fields(entry_id, fields))
                sendable.append(entry_id)
            except OutboxEntryError as exc:
                malformed.append((entry_id, fields, str(exc)))
        if malformed:
            await self._dead_letter(malformed, stream)
        try:
            await self._publish(entries)
        except PublishError as exc:
            if exc.sent:
                await self.remove(sendable[: exc.sent], stream)
            raise
        await self.remove(sendable, stream)
        return len(sendable)

    async def _publish(self, entries: Sequence[OutboxEntry]) -> None:
        """Send ``entries``: in the relay's thread, or (``in_thread`` false) on the event loop,
        ``loop_chunk`` at a time with the loop let run between chunks."""
        if self.in_thread:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._thread, self.publisher.publish, entries)
            return
        for start in range(0, len(entries), self.loop_chunk):
            try:
                self.publisher.publish(entries[start : start + self.loop_chunk])
            except PublishError as exc:
                raise PublishError(str(exc), sent=start + exc.sent) from exc
            await asyncio.sleep(0)

    async def remove(self, entry_ids: Sequence[str], stream: str) -> None:
        """Delete sent entries from the outbox ``stream`` (one ``XDEL``)."""
        if entry_ids:
            await self.redis.xdel(stream, *entry_ids)

    async def close(self) -> None:
        """Stop the relay's thread (after its send in progress) and release the broker."""
        close = getattr(self.publisher, "close", None)
        loop = asyncio.get_running_loop()
        if close is not None:
            with contextlib.suppress(Exception):
                await loop.run_in_executor(self._thread, close)
        self._thread.shutdown(wait=False)

    async def _dead_letter(
        self, malformed: list[tuple[str, dict[Any, Any], str]], stream: str
    ) -> None:
        """Entries no relay can send: kept on the partition's dead-letter stream and removed,
        together."""
        pipe = self.redis.pipeline(transaction=True)
        for entry_id, fields, error in malformed:
            log.error("relay.malformed_entry", extra={"entry_id": entry_id, "error": error})
            raw: dict[Any, Any] = {f"raw_{_text(k)}": _text(v)[:4096] for k, v in fields.items()}
            pipe.xadd(
                keys.dead_letter_stream(self._streams.get(stream, 0)),
                {**raw, "stream": stream, "entry_id": entry_id, "error": error},
                maxlen=keys.dead_letter_maxlen, approximate=True,
            )  # fmt: skip
        pipe.xdel(stream, *[entry_id for entry_id, _f, _e in malformed])
        await pipe.execute()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
