"""The outbox relay: dispatches committed to an outbox are sent to Celery, then removed.

Every commit that dispatches work appends it to an outbox stream in the same atomic Redis
operation as the state awaiting it: the coordinator's commit script to the commits' outbox
(:func:`shared.keys.commit_outbox_stream`), a reasoning worker's publish of the tool calls it
chains, with its observation, to the workers' outbox (:func:`shared.keys.outbox_stream`). A
relay runs in each coordinator process (:meth:`coordinator.service.Coordinator.run`) and serves
the outboxes of the partitions whose lease its coordinator holds
(:mod:`coordinator.partition_leases`), in two loops:

- **commits** (:data:`COMMITS_LOOP`): the commit script returns the ids of the entries it
  appended, and the coordinator hands them to its relay in-process (:meth:`OutboxRelay.hand`,
  through :attr:`coordinator.store.TaskStore.dispatched`): they are sent at once, with no read.
  What a round (``flush_s``, 0.25 s) sent is removed at its end, one ``XDEL`` per partition,
  or earlier, once the oldest of it went out more than ``flush_s`` ago (a long sweep, a burst
  behind a slow broker).
  The stream is read from ``0-0`` (a *sweep*) only in the relay's first round on a partition
  (its start, a takeover), after a failed send, and every ``sweep_s`` (5 s): for a dead
  coordinator's entries and any hand-off that did not come (a commit of a coordinator that
  has lost the partition since). A hand-off of an entry a sweep already saw is not sent again
  (ids are ordered: the sweep saw every id up to the last it read).
- **chained calls** (:data:`CHAINED_LOOP`): the workers' outbox is read as before issue 27's
  hand-off: every entry still on it (``XREAD`` from ``0-0``, in batches, blocking while there
  are none), sent, then the batch deleted (one ``XDEL``). Apart from the commits' stream so
  that this blocking read is not woken by every commit.

Each entry is sent through Celery's own API (:class:`CeleryPublisher`: the message
``Celery.send_task`` would send, on one producer per batch; no message layout written here).
An outbox is the list of dispatches not yet sent (or sent in the last round): an entry leaves
it only once sent, so there is no consumer group and no pending list to keep. The partition
lease is what keeps two relays off one outbox: a handover overlaps no round (a drained
partition's lease is released only once each loop has started a new round,
:meth:`PartitionLeases.serving`), and a coordinator paused past its lease stops serving
before, or as, another takes over.

Delivery is at least once. A relay killed between the send and the removal leaves its entries
on the outbox; the next relay to serve the partition (the coordinator that takes its lease, or
the same one restarted) reads them first and sends them again, with the same Celery task id.
The fences make the second copy harmless: its observation carries the iteration and attempt
already applied and is ignored, and a tool that must apply once replays its kept result
(:mod:`workers.applied_calls`). A send that fails (the broker unreachable) removes (or notes
for removal) what went out and leaves the rest on the outbox, in front of anything newer:
the relay reads them first again after a back-off, which both loops share (no loop asks the
broker again before it ends). Within a round the relay asks the leases held in memory again
before each chunk it sends and each batch a sweep reads (no Redis command, and without telling
a drain that the loop has moved on), and stops sending a partition whose lease is gone; a
relay whose lease lapses during a chunk may still send what the new holder also sends: two
copies, as above.

The send is blocking (kombu's producer). By default it runs on the event loop, ``loop_chunk``
(8) entries at a time with the loop let run between chunks (about 0.3 ms of CPU and one
``LPUSH`` round trip per entry): in the relay's own thread (``in_thread``) each of kombu's
socket operations gave the GIL back and waited for it behind the coordinator's busy loop, and
in ``bench/slow_model_bench.py`` the 200 first dispatches of a burst then reached the model
0.7 s later than on the loop (docs/performance.md, "The transactional outbox"). A commit never
waits for a send (a hand-off is a queue append), but a send on the loop that the broker stalls
stalls the loop, up to the broker's socket timeout, once per back-off.

When the broker is the state Redis, a commit pushes its dispatches onto their queues itself
(:meth:`CeleryPublisher.inline_messages` lays each message out,
:attr:`coordinator.store.TaskStore.inline`): nothing of those reaches the commits' outbox, and
this relay sends the workers' chained calls, what a sweep finds, and the dispatches of a commit
that could not lay them out (handed to it as without inline dispatch).

Everything that moves bytes to the broker is behind the one-method
:class:`~coordinator.transport.Transport`: tests give the relay a transport of their own, the
coordinator never imports worker code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from celery import Celery, signals
from kombu.connection import Connection
from kombu.entity import maybe_delivery_mode
from kombu.serialization import dumps as serialize
from kombu.utils.json import dumps as dumps_json
from kombu.utils.uuid import uuid as delivery_tag
from redis.asyncio import Redis

from coordinator.streams import read_streams
from coordinator.transport import PublishError, Transport
from shared import keys
from shared.errors import ConfigError
from shared.outbox import OutboxEntry, OutboxEntryError
from shared.settings import OrgaSettings, celery_broker_url, celery_config

__all__ = ["CHAINED_LOOP", "COMMITS_LOOP", "CeleryPublisher", "OutboxRelay", "PublishError"]

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

    def __init__(self, app: Celery, broker_depths: bool = False, inline: bool = False) -> None:
        self.app = app
        self.broker_depths = broker_depths
        self._inline = inline
        self._layout: Any = None
        """A kombu channel (untyped) of kombu's in-memory transport, which lays a message out
        as its Redis transport does (:meth:`inline_messages`), never touching the network."""
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
        own_broker = settings.broker_url not in (None, settings.redis_url)
        if broker_depths is None:
            broker_depths = own_broker
        inline = settings.inline_dispatch and not own_broker and not settings.redis_cluster
        return cls(app, broker_depths=broker_depths, inline=inline)

    @property
    def inline(self) -> bool:
        """Whether a commit may push its dispatches onto the queues itself
        (:class:`~coordinator.transport.InlineQueues`): the broker is the state Redis
        (``ORGA_INLINE_DISPATCH``, on by default), and nothing a send through Celery adds is
        configured: no compression, no ``task-sent`` event, no key prefix on the broker, no
        receiver of Celery's publish signals (an instrumentation that writes headers there), no
        message priority; checked when the coordinator is built."""
        conf = self.app.conf
        options = conf.broker_transport_options
        return (
            self._inline
            and not conf.task_compression
            and not conf.task_send_sent_event
            and conf.task_default_priority is None
            and conf.task_queue_max_priority is None
            and not options.get("global_keyprefix")
            and not signals.before_task_publish.receivers
            and not signals.after_task_publish.receivers
            and not signals.task_sent.receivers
        )

    def inline_messages(self, entries: Sequence[OutboxEntry]) -> list[tuple[str, bytes]]:
        """For each entry, its queue's list and the message kombu's Redis transport would push
        there for :meth:`publish`'s send of it, the same fields and values (the delivery tag
        aside, a new one each send; ``tests/coordinator/test_inline_dispatch.py`` compares the
        two): Celery's ``app.amqp.create_task_message``, with the route :meth:`publish` uses;
        the body serialized by kombu's serializer registry (``kombu.serialization.dumps``);
        the envelope made by ``prepare_message`` and ``encode_body`` of a channel of kombu's
        in-memory transport (the Redis transport's own: both are kombu's virtual transport,
        given the broker's transport options; no connection, no network); what the
        transport's publish adds itself (where it delivered it: the default exchange, the
        queue's name as the routing key, which Celery picks for a direct exchange; the body's
        encoding; a delivery tag) added here, as are the three properties Celery's
        ``send_task_message`` adds (``delivery_mode``, ``argsrepr``, ``kwargsrepr``), and the
        whole as kombu's JSON. Priority 0 (:attr:`inline` requires no priority): the queue's
        own list."""
        app = self.app
        conf = app.conf
        channel = self._layout_channel()
        reply_to = app.thread_oid
        messages: list[tuple[str, bytes]] = []
        for entry in entries:
            options = self._route(entry.task, entry.queue)
            queue = options.pop("queue")
            if queue.exchange.type != "direct" or options.get("exchange"):
                raise PublishError(
                    f"{entry.task} routes to queue {queue.name!r} through exchange "
                    f"{options.get('exchange') or queue.exchange.name!r} "
                    f"({queue.exchange.type}): only a direct route, which Celery sends to the "
                    "queue itself, is pushed inline",
                    sent=len(messages),
                )
            message = self._task_message(entry, options, reply_to, sent_event=False)
            headers, properties, body, _sent_event = message
            properties.update(argsrepr=entry.argsrepr, kwargsrepr="{}")
            properties["delivery_mode"] = maybe_delivery_mode(  # type: ignore[no-untyped-call]
                queue.exchange.delivery_mode or conf.task_default_delivery_mode
            )
            content_type, encoding, data = serialize(body, serializer=conf.task_serializer)  # type: ignore[no-untyped-call]
            message = channel.prepare_message(data, 0, content_type, encoding, headers, properties)
            message["body"], body_encoding = channel.encode_body(
                message["body"], channel.body_encoding
            )
            sent = message["properties"]
            sent.update(body_encoding=body_encoding, delivery_tag=delivery_tag())
            sent["delivery_info"].update(exchange="", routing_key=queue.name)
            messages.append((queue.name, dumps_json(message).encode()))  # type: ignore[no-untyped-call]
        return messages

    def _task_message(
        self, entry: OutboxEntry, options: dict[str, Any], reply_to: str, sent_event: bool
    ) -> Any:
        """The message ``Celery.send_task`` builds for ``entry`` (``app.amqp.create_task_message``,
        with its route's ``options``): what :meth:`publish` sends and :meth:`inline_messages`
        lays out."""
        return self.app.amqp.create_task_message(
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

    def _layout_channel(self) -> Any:
        """The in-memory channel :meth:`inline_messages` lays messages out with, made once."""
        channel = self._layout
        if channel is None:
            options = dict(self.app.conf.broker_transport_options)
            connection = Connection("memory://", transport_options=options)  # type: ignore[no-untyped-call]
            channel = self._layout = connection.default_channel
        return channel

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
                    message = self._task_message(entry, options, reply_to, sent_event)
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
        layout, self._layout = self._layout, None
        if layout is not None:
            with contextlib.suppress(Exception):
                layout.connection.client.release()
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


COMMITS_LOOP = "relay.commits"
"""The relay's loop that sends what its coordinator's commits hand it (partition leases' name)."""
CHAINED_LOOP = "relay"
"""The relay's loop that reads the workers' outbox (partition leases' name)."""


@dataclass
class OutboxRelay:
    """One relay (``name``, for its logs) of the outboxes of the partitions served: two loops
    (:data:`COMMITS_LOOP`, :data:`CHAINED_LOOP`), each asking ``serving`` with its name."""

    redis: Redis
    publisher: Transport
    name: str
    batch: int = keys.outbox_batch
    partitions: int = 1
    """The deployment's partition count."""
    serving: Callable[[str | None], Collection[int]] | None = None
    """The partitions whose outboxes this relay serves, asked with the loop's name at the start
    of each round of that loop (the coordinator's partition leases), and with None (which tells
    no drain the loop has moved on) between the sends of a round; None: every partition."""
    block_ms: int = 1000
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    in_thread: bool = False
    loop_chunk: int = 8
    flush_s: float = keys.commit_outbox_flush_s
    """A round of the commits' loop: the committed entries it sent are removed at its end (or
    as soon as the oldest of them was sent more than this long ago)."""
    sweep_s: float = keys.commit_outbox_sweep_s
    max_handed: int = 10_000
    """Hand-offs kept waiting at most; beyond, the partition's are dropped and swept instead."""
    _thread: ThreadPoolExecutor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orga-relay")
        self._streams = {keys.outbox_stream(p): p for p in range(self.partitions)}
        self._streams.update({keys.commit_outbox_stream(p): p for p in range(self.partitions)})
        self._served: list[str] = [keys.outbox_stream(p) for p in range(self.partitions)]
        self._handed: deque[tuple[int, str, OutboxEntry]] = deque()
        self._waiting: asyncio.Future[None] | None = None
        """What the commits' loop awaits while nothing is handed: a hand-off resolves it, so
        the loop runs at the event loop's next turn (a ``wait_for`` on an event took three)."""
        self._commits_served: frozenset[int] = frozenset()
        self._sweep_due: set[int] = set()
        """Partitions whose commits' outbox is read from ``0-0`` next round (hand-offs of
        them ignored meanwhile: the sweep finds their entries)."""
        self._swept_upto: dict[int, tuple[int, int]] = {}
        """Per partition swept this round, the last id the sweep saw: every entry up to it
        was seen then (a hand-off of one of them that comes in the round is not sent)."""
        self._sent: dict[int, list[str]] = {}
        """Committed entries sent and not removed yet, by partition (removed each round)."""
        self._sent_since: float | None = None
        """When the oldest entry of ``_sent`` was sent (loop time); None when it is empty."""
        self._next_sweep = 0.0
        self._broker_paused_until = 0.0
        self._broker_pause_s = 0.0

    @property
    def loops(self) -> tuple[str, str]:
        """The names its loops ask ``serving`` with (registered with the partition leases)."""
        return (COMMITS_LOOP, CHAINED_LOOP)

    def _serving(self, loop: str) -> frozenset[int]:
        if self.serving is None:
            return frozenset(range(self.partitions))
        return frozenset(self.serving(loop))

    def _lost(self, partition: int) -> bool:
        """Whether the lease of ``partition`` is gone since the round started (asked of the
        leases held in memory: no Redis command); if so its hand-offs waiting are dropped and
        it is swept when served again (its new holder sweeps what is left meanwhile)."""
        if self.serving is None or partition in self.serving(None):
            return False
        self._drop_handed({partition})
        return True

    # -- the commits' outbox: handed in-process ---------------------------------------------

    def hand(self, partition: int, entries: Sequence[tuple[str, OutboxEntry]]) -> None:
        """A commit of ``partition`` was written with these outbox entries (stream id, entry):
        sent by the commits' loop at once (no read). Not blocking, never raising: an entry
        not sent from here (a partition not served, a failed send, too many waiting) stays on
        the commits' outbox for a sweep."""
        if partition in self._sweep_due:
            return
        if len(self._handed) + len(entries) > self.max_handed:
            self._drop_handed({partition})
            return
        self._handed.extend((partition, entry_id, entry) for entry_id, entry in entries)
        _wake(self._waiting)

    def _drop_handed(self, partitions: set[int]) -> None:
        """Forget the hand-offs of ``partitions``, swept next round instead."""
        self._sweep_due |= partitions
        self._handed = deque(h for h in self._handed if h[0] not in partitions)

    async def commits_round(self, stopping: asyncio.Event | None = None) -> int:
        """One round of the commits' loop: sweep the partitions due (just served, or every
        ``sweep_s``), send what is handed until ``flush_s`` has passed (at once without
        ``stopping``), then remove what was sent (one ``XDEL`` per partition); how many were
        sent."""
        served = self._serving(COMMITS_LOOP)
        loop = asyncio.get_running_loop()
        self._sweep_due |= served - self._commits_served
        self._commits_served = served
        if loop.time() >= self._next_sweep:
            self._next_sweep = loop.time() + self.sweep_s
            self._sweep_due |= served
        sent = 0
        self._swept_upto.clear()  # a hand-off a round late is sent twice, never skipped
        try:
            for partition in sorted(self._sweep_due & served):
                sent += await self._sweep(partition)
            deadline = loop.time() + self.flush_s
            while True:
                sent += await self._send_handed(served)
                remaining = deadline - loop.time()
                if stopping is None or stopping.is_set() or remaining <= 0:
                    break
                if not self._handed:
                    await self._handed_within(remaining)
        finally:
            await self._flush()
        return sent

    async def _handed_within(self, timeout_s: float) -> None:
        """Wait for a hand-off, ``timeout_s`` at most."""
        loop = asyncio.get_running_loop()
        waiting = self._waiting = loop.create_future()
        timer = loop.call_later(timeout_s, _wake, waiting)
        try:
            await waiting
        finally:
            timer.cancel()
            self._waiting = None

    async def _send_handed(self, served: frozenset[int]) -> int:
        """Send the hand-offs waiting, partition by partition (each in commit order)."""
        by_partition: dict[int, list[tuple[str, OutboxEntry]]] = {}
        while self._handed:
            partition, entry_id, entry = self._handed.popleft()
            if partition not in served or partition in self._sweep_due:
                continue  # another relay's now (its sweep), or swept here next round
            swept = self._swept_upto.get(partition)
            if swept is not None and _id(entry_id) <= swept:
                continue  # seen (and sent) by the sweep already
            by_partition.setdefault(partition, []).append((entry_id, entry))
        sent = 0
        try:
            for partition, pairs in by_partition.items():
                sent += await self._send_committed(partition, pairs)  # checks the lease first
        except BaseException:
            self._sweep_due |= set(by_partition)  # taken off the queue: swept instead
            raise
        return sent

    async def _send_committed(self, partition: int, pairs: list[tuple[str, OutboxEntry]]) -> int:
        """Publish committed entries, ``loop_chunk`` at a time (in the relay's thread too: a
        chunk's sends are noted when it is back, so a larger one would outlast ``flush_s``);
        note those sent for removal. Before each chunk, stop if the partition's lease
        is gone (:meth:`_lost`); after it, remove what was sent (:meth:`_flush`) once the
        oldest of it went out more than ``flush_s`` ago, so that a long send (a burst behind a
        slow broker) keeps the ``flush_s`` bound. A failure drops the waiting hand-offs
        (swept next round) and raises."""
        noted = self._sent.setdefault(partition, [])
        loop = asyncio.get_running_loop()
        chunk = self.loop_chunk
        sent = 0
        for start in range(0, len(pairs), max(chunk, 1)):
            if self._lost(partition):
                break
            part = pairs[start : start + chunk]
            try:
                await self._publish([entry for _id, entry in part])
            except PublishError as exc:
                self._note(noted, [entry_id for entry_id, _e in part[: exc.sent]], loop.time())
                self._drop_handed({partition, *(h[0] for h in self._handed)})
                raise
            self._note(noted, [entry_id for entry_id, _e in part], loop.time())
            sent += len(part)
            if self._sent_since is not None and loop.time() - self._sent_since > self.flush_s:
                await self._flush()  # empties ``noted`` (the same list) in place
        return sent

    def _note(self, noted: list[str], entry_ids: list[str], now: float) -> None:
        """Note ``entry_ids`` (sent at ``now``) for removal."""
        if entry_ids:
            noted += entry_ids
            if self._sent_since is None:
                self._sent_since = now

    async def _sweep(self, partition: int) -> int:
        """Send every entry on the partition's commits' outbox not sent by this relay yet
        (``XREAD`` from ``0-0``, ``batch`` at a time); the hand-offs waiting are covered by
        it (committed, so on the stream or already removed)."""
        self._handed = deque(h for h in self._handed if h[0] != partition)
        self._sweep_due.discard(partition)  # hand-offs from now on are sent, or seen here
        stream = keys.commit_outbox_stream(partition)
        cursor, sent = "0-0", 0
        try:
            while True:
                if cursor != "0-0" and self._lost(partition):
                    return sent  # the new holder sweeps the rest (swept here when served again)
                rows = await read_streams(self.redis, [stream], start=cursor, count=self.batch)
                got = rows[0][1] if rows else []
                if got:
                    cursor = got[-1][0]
                noted = set(self._sent.get(partition, ()))
                fresh = [(entry_id, f) for entry_id, f in got if entry_id not in noted]
                entries = await self._entries(fresh, stream)
                sent += await self._send_committed(partition, entries)
                await self._flush()  # a long sweep removes as it goes (``flush_s`` bound)
                if len(got) < self.batch:
                    break
        except BaseException:
            self._sweep_due.add(partition)
            raise
        self._swept_upto[partition] = _id(cursor)
        return sent

    async def _flush(self) -> None:
        """Remove the committed entries sent (one ``XDEL`` per partition, one round trip)."""
        pending = {p: list(ids) for p, ids in self._sent.items() if ids}
        if not pending:
            return
        pipe = self.redis.pipeline(transaction=False)
        for partition, ids in pending.items():
            pipe.xdel(keys.commit_outbox_stream(partition), *ids)
        await pipe.execute()
        for partition, ids in pending.items():
            del self._sent[partition][: len(ids)]
        if not any(self._sent.values()):
            self._sent_since = None

    # -- the workers' outbox: read --------------------------------------------------------

    async def run(self, stopping: asyncio.Event) -> None:
        """Relay until ``stopping`` is set, each loop backing off on its failures (Redis or the
        broker down)."""
        try:
            await asyncio.gather(
                self._loop(stopping, lambda: self.commits_round(stopping)),
                self._loop(stopping, self.chained_round),
            )
        finally:
            with contextlib.suppress(Exception):
                await self._flush()
            await self.close()

    async def _loop(self, stopping: asyncio.Event, body: Callable[[], Awaitable[int]]) -> None:
        failures = 0
        while not stopping.is_set():
            try:
                await body()
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

    async def relay_once(self) -> int:
        """One round of each loop, without waiting for hand-offs: what is handed and due, then
        one read of the workers' outbox (blocking only when the first sent nothing); how many
        were sent."""
        sent = await self.commits_round()
        return sent + await self.chained_round(block=not sent)

    async def chained_round(self, block: bool = True) -> int:
        """Send one batch of the workers' outboxes served and remove what was sent; how many
        were sent. The oldest entries come first: a failed send's rest, a dead relay's, then
        new ones (waiting up to ``block_ms`` for one when the outboxes are empty)."""
        self._served = [keys.outbox_stream(p) for p in sorted(self._serving(CHAINED_LOOP))]
        sent = 0
        for stream, rows in await self.read(block):
            sent += await self.send(rows, stream)
        return sent

    async def read(self, block: bool = True) -> list[tuple[str, list[tuple[str, dict[Any, Any]]]]]:
        """Up to ``batch`` entries still on each workers' outbox served, oldest first
        (``XREAD`` from ``0-0``), by stream."""
        block_ms = self.block_ms if block else None
        if not self._served:  # no partition served: wait as a blocking read would
            if block_ms:
                await asyncio.sleep(block_ms / 1000)
            return []
        return await read_streams(
            self.redis, self._served, start="0-0", count=self.batch, block_ms=block_ms
        )

    async def send(self, rows: Sequence[tuple[str, dict[Any, Any]]], stream: str) -> int:
        """Publish ``rows`` (of the outbox ``stream``) and remove those sent; raises
        PublishError after removing the ones that went out before the failure (the rest stay
        on the outbox, the first ones the next read returns)."""
        if not rows:
            return 0
        pairs = await self._entries(rows, stream)
        sendable = [entry_id for entry_id, _e in pairs]
        try:
            await self._publish([entry for _id, entry in pairs])
        except PublishError as exc:
            if exc.sent:
                await self.remove(sendable[: exc.sent], stream)
            raise
        await self.remove(sendable, stream)
        return len(sendable)

    async def _entries(
        self, rows: Sequence[tuple[str, dict[Any, Any]]], stream: str
    ) -> list[tuple[str, OutboxEntry]]:
        """The entries of ``rows``; malformed ones dead-lettered (and removed)."""
        entries, malformed = [], []
        for entry_id, fields in rows:
            try:
                entries.append((entry_id, OutboxEntry.from_fields(entry_id, fields)))
            except OutboxEntryError as exc:
                malformed.append((entry_id, fields, str(exc)))
        if malformed:
            await self._dead_letter(malformed, stream)
        return entries

    async def _publish(self, entries: Sequence[OutboxEntry]) -> None:
        """Send ``entries``: in the relay's thread, or (``in_thread`` false) on the event loop,
        ``loop_chunk`` at a time with the loop let run between chunks. After a failed send, no
        loop of the relay asks the broker again for a back-off (``backoff_s`` doubling to
        ``max_backoff_s``): a broker stall blocks the event loop once per back-off, not once
        per loop."""
        if not entries:
            return
        loop = asyncio.get_running_loop()
        if loop.time() < self._broker_paused_until:
            raise PublishError(
                f"not sending {len(entries)} entries: the broker failed a send "
                f"{self._broker_pause_s:g} s ago or less (back-off shared by the relay's loops)",
                sent=0,
            )
        try:
            await self._publish_now(entries)
        except PublishError:
            self._broker_pause_s = min(
                max(self._broker_pause_s * 2, self.backoff_s), self.max_backoff_s
            )
            self._broker_paused_until = loop.time() + self._broker_pause_s
            raise
        self._broker_pause_s = 0.0

    async def _publish_now(self, entries: Sequence[OutboxEntry]) -> None:
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


def _wake(waiting: asyncio.Future[None] | None) -> None:
    """Resolve the commits' loop's wait, if it waits."""
    if waiting is not None and not waiting.done():
        waiting.set_result(None)


def _id(entry_id: str) -> tuple[int, int]:
    """A stream id as a pair that orders as Redis orders ids."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
