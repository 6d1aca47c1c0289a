"""Dispatches: appended to the outbox by the commit that awaits them, sent to Celery by a relay
through ``send_task`` (read back by kombu), removed once sent, taken over from a dead relay,
left for a retry when the send fails; a commit's handed to the relay in-process, read back only
by a sweep."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from kombu import Connection
from redis.asyncio import Redis

from coordinator import relay as relay_module
from coordinator.machine import MachineSettings, TaskMachine
from coordinator.relay import CeleryPublisher, OutboxRelay, PublishError
from coordinator.state import TaskRecord
from coordinator.store import CommitConflictError, TaskStore
from shared import keys
from shared.outbox import OutboxEntry, dispatch_entries
from shared.protocol import ReasonRequest
from shared.settings import OrgaSettings
from shared.task_spec import parse_task
from tests.coordinator.outbox_samples import sample_entry

SETTINGS = MachineSettings(workspace_root="/ws")


def _record(task_id: str = "t") -> TaskRecord:
    spec = parse_task({"goal": "g", "steps": [{"id": "s", "instruction": "x"}]})
    return TaskRecord(task_id=task_id, spec=spec, created_at=1.0, updated_at=1.0)


async def _started(store: TaskStore, task_id: str = "t") -> list[OutboxEntry]:
    """Create a task and commit its start; the start's dispatches."""
    record = _record(task_id)
    await store.create(record)
    machine = TaskMachine(record, 2.0, SETTINGS)
    effects = machine.start()
    dispatches = dispatch_entries(effects.reason_dispatches, effects.tool_dispatches)
    await store.commit(machine.record, effects, dispatches=dispatches)
    return dispatches


async def _add(client: Redis, *entries: OutboxEntry) -> None:
    for entry in entries:
        await client.xadd(keys.outbox_stream(0), entry.fields())  # type: ignore[arg-type]


class _Recording:
    """A publisher that keeps what it was given; ``fail_after``: raises once, when that many
    entries have been sent."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.sent: list[OutboxEntry] = []
        self.fail_after = fail_after

    def publish(self, entries: Sequence[OutboxEntry]) -> None:
        for index, entry in enumerate(entries):
            if self.fail_after is not None and len(self.sent) == self.fail_after:
                self.fail_after = None
                raise PublishError("broker unreachable (test)", sent=index)
            self.sent.append(entry)


def test_a_commit_appends_its_dispatches_and_a_refused_one_nothing(
    redis_url: str, redis_client: Any
) -> None:
    """The dispatch is on the outbox with the commit that awaits it, not with a stale one."""

    async def scenario() -> None:
        async with redis_client() as client:
            store = TaskStore(client)
            record = _record()
            await store.create(record)
            stale = record.model_copy(deep=True)
            machine = TaskMachine(record, 2.0, SETTINGS)
            effects = machine.start()
            (sent,) = dispatch_entries(effects.reason_dispatches, effects.tool_dispatches)
            await store.commit(machine.record, effects, dispatches=[sent])
            ((entry_id, fields),) = await client.xrange(keys.commit_outbox_stream(0))
            assert OutboxEntry.from_fields(entry_id.decode(), fields) == sent
            request = ReasonRequest.model_validate_json(sent.payload)
            assert request.fence.task_id == "t" and sent.queue == keys.reasoning_queue
            assert await client.llen(keys.reasoning_queue) == 0  # the relay sends it

            other = TaskMachine(stale, 3.0, SETTINGS)
            effects = other.start()
            late = dispatch_entries(effects.reason_dispatches, effects.tool_dispatches)
            with pytest.raises(CommitConflictError):
                await store.commit(other.record, effects, dispatches=late)
            assert await client.xlen(keys.commit_outbox_stream(0)) == 1

    asyncio.run(scenario())


def test_the_relay_sends_through_send_task_and_removes_the_entry(
    redis_url: str, redis_client: Any
) -> None:
    """The relay's message is Celery's own (kombu reads the task, the id fixed in the entry and
    the one argument back); the entry is then deleted."""

    async def scenario() -> list[OutboxEntry]:
        async with redis_client() as client:
            store = TaskStore(client)
            dispatches = await _started(store)
            publisher = CeleryPublisher.from_settings(OrgaSettings(redis_url=redis_url))
            relay = OutboxRelay(client, publisher, "r1")
            assert await relay.relay_once() == 1
            assert await client.xlen(keys.commit_outbox_stream(0)) == 0
            await relay.close()
            return dispatches

    (sent,) = asyncio.run(scenario())
    with Connection(redis_url) as connection:
        queue = connection.SimpleQueue(keys.reasoning_queue)
        message = queue.get(timeout=5)
        assert message.headers["task"] == keys.reason_task_name
        assert message.headers["id"] == sent.id
        assert message.headers["argsrepr"] == sent.argsrepr
        assert message.headers["shadow"] == sent.shadow
        args, kwargs, _embed = message.decode()
        assert args == [sent.payload] and kwargs == {}
        message.ack()
        queue.close()


def test_a_batch_is_read_sent_and_removed_together(redis_url: str, redis_client: Any) -> None:
    """Up to ``batch`` entries go in one send, in order, and are removed in one call."""

    async def scenario() -> None:
        async with redis_client() as client:
            publisher = _Recording()
            relay = OutboxRelay(client, publisher, "r1", batch=3, block_ms=1)
            await _add(client, *map(sample_entry, range(5)))
            assert await relay.relay_once() == 3
            assert await relay.relay_once() == 2
            assert [e.id for e in publisher.sent] == [f"id-{n}" for n in range(5)]
            assert await client.xlen(keys.outbox_stream(0)) == 0
            assert await relay.relay_once() == 0
            await relay.close()

    asyncio.run(scenario())


def test_a_dead_relays_entries_are_sent_by_the_next_relay(
    redis_url: str, redis_client: Any
) -> None:
    """Entries read by a relay that never removed them stay on the outbox: the next relay to
    serve the partition sends them, oldest first and with the same Celery task id, then the
    newer ones."""

    async def scenario() -> None:
        async with redis_client() as client:
            dead = OutboxRelay(client, _Recording(), "dead", block_ms=1)
            await _add(client, sample_entry(1), sample_entry(2))
            [(_stream, rows)] = await dead.read()
            assert len(rows) == 2  # read, then killed before sending
            await _add(client, sample_entry(3))

            taker = _Recording()
            live = OutboxRelay(client, taker, "live", block_ms=1)
            assert await live.relay_once() == 3
            assert [e.id for e in taker.sent] == ["id-1", "id-2", "id-3"]
            assert await client.xlen(keys.outbox_stream(0)) == 0
            assert await live.relay_once() == 0
            for relay in (dead, live):
                await relay.close()

    asyncio.run(scenario())


def test_a_relay_reads_only_the_outboxes_of_the_partitions_it_serves(
    redis_url: str, redis_client: Any
) -> None:
    """With its coordinator serving partition 1 of 2, a relay sends that outbox's entries and
    leaves partition 0's on its outbox for that partition's holder."""

    async def scenario() -> None:
        async with redis_client() as client:
            for p, n in ((0, 1), (1, 2)):
                entry = sample_entry(n)
                await client.xadd(keys.outbox_stream(p), entry.fields())  # type: ignore[arg-type]
            publisher = _Recording()
            relay = OutboxRelay(
                client, publisher, "r1", block_ms=1, partitions=2, serving=lambda _loop: {1}
            )
            assert await relay.relay_once() == 1
            assert [e.id for e in publisher.sent] == ["id-2"]
            assert await client.xlen(keys.outbox_stream(1)) == 0
            assert await client.xlen(keys.outbox_stream(0)) == 1
            await relay.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("in_thread", [False, True], ids=["on-loop", "in-thread"])
def test_a_failed_send_leaves_the_rest_for_a_retry(
    redis_url: str, redis_client: Any, in_thread: bool
) -> None:
    """A send failing mid-batch removes what went out and keeps the rest on the outbox; the
    relay sends those first on its next round, before anything new."""

    async def scenario() -> None:
        async with redis_client() as client:
            publisher = _Recording(fail_after=1)
            relay = OutboxRelay(
                client, publisher, "r1", block_ms=1, in_thread=in_thread, loop_chunk=1,
                backoff_s=0,
            )  # fmt: skip
            await _add(client, *map(sample_entry, range(3)))
            with pytest.raises(PublishError):
                await relay.relay_once()
            assert [e.id for e in publisher.sent] == ["id-0"]
            assert await client.xlen(keys.outbox_stream(0)) == 2
            await _add(client, sample_entry(9))
            assert await relay.relay_once() == 3  # the unsent ones first, then the new one
            assert await relay.relay_once() == 0
            assert [e.id for e in publisher.sent] == ["id-0", "id-1", "id-2", "id-9"]
            assert await client.xlen(keys.outbox_stream(0)) == 0
            await relay.close()

    asyncio.run(scenario())


def test_celery_publisher_failure_keeps_the_entry(redis_url: str, redis_client: Any) -> None:
    """A broker that refuses connections fails the send with a PublishError naming the
    entry, and the entry stays on the outbox."""

    async def scenario() -> None:
        async with redis_client() as client:
            unreachable = OrgaSettings(redis_url="redis://127.0.0.1:1/0")
            publisher = CeleryPublisher.from_settings(unreachable)
            publisher.app.conf.task_publish_retry = False
            publisher.app.conf.broker_connection_max_retries = 0
            relay = OutboxRelay(client, publisher, "r1", block_ms=1)
            await _add(client, sample_entry(1))
            with pytest.raises(PublishError, match=r"id-1 to orga\.reasoning failed"):
                await relay.relay_once()
            assert await client.xlen(keys.outbox_stream(0)) == 1
            await relay.close()

    asyncio.run(scenario())


def test_an_entry_lacking_fields_is_dead_lettered(redis_url: str, redis_client: Any) -> None:
    """An entry no relay can send goes to orga:dead_letter and off the outbox, not forever
    pending in front of the others."""

    async def scenario() -> None:
        async with redis_client() as client:
            publisher = _Recording()
            relay = OutboxRelay(client, publisher, "r1", block_ms=1)
            await client.xadd(keys.outbox_stream(0), {"task": "orga.reason"})
            await _add(client, sample_entry(1))
            assert await relay.relay_once() == 1
            assert [e.id for e in publisher.sent] == ["id-1"]
            ((_id, fields),) = await client.xrange(keys.dead_letter_stream(0))
            assert b"lacks id, queue" in fields[b"error"]
            assert await client.xlen(keys.outbox_stream(0)) == 0
            await relay.close()

    asyncio.run(scenario())


def test_a_coordinator_refuses_another_partition_count_and_an_unpartitioned_deployment(
    redis_client: Any,
) -> None:
    from coordinator.service import check_layout
    from shared.errors import ConfigError

    async def scenario() -> None:
        async with redis_client() as client:
            assert await check_layout(client, 4) == 4
            assert await client.get(keys.partitions_key) == b"4"
            with pytest.raises(ConfigError, match=r"ORGA_PARTITIONS=16 .* created with 4"):
                await check_layout(client, 16)
            await client.sadd(keys.legacy_active_tasks_key, "old-task")
            with pytest.raises(ConfigError, match=r"orga:tasks:active .*drain"):
                await check_layout(client, 4)

    asyncio.run(scenario())


def _counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The streams of each read the relay makes from now on."""
    reads: list[list[str]] = []
    real = relay_module.read_streams

    async def counted(redis: Redis, streams: Any, **options: Any) -> Any:
        reads.append(list(streams))
        return await real(redis, streams, **options)

    monkeypatch.setattr(relay_module, "read_streams", counted)
    return reads


def test_a_commits_entries_are_handed_to_the_relay_sent_unread_and_removed_together(
    redis_url: str, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After its first sweep, a relay sends what commits hand it without reading the outbox,
    and removes a round's entries together at the round's end (one ``XDEL``)."""

    async def scenario() -> None:
        async with redis_client() as client:
            publisher = _Recording()
            relay = OutboxRelay(client, publisher, "r1", block_ms=1)
            store = TaskStore(client, dispatched=relay.hand)
            assert await relay.commits_round() == 0  # the first round sweeps: nothing there
            reads = _counting_reads(monkeypatch)
            sent = [*await _started(store, "a"), *await _started(store, "b")]
            assert await client.xlen(keys.commit_outbox_stream(0)) == 2
            await client.config_resetstat()
            assert await relay.commits_round() == 2
            assert publisher.sent == sent
            assert reads == []
            stats = await client.info("commandstats")
            assert stats["cmdstat_xdel"]["calls"] == 1
            assert "cmdstat_xread" not in stats
            assert await client.xlen(keys.commit_outbox_stream(0)) == 0
            await relay.close()

    asyncio.run(scenario())


def test_a_dead_coordinators_committed_entries_are_sent_by_the_next_relays_sweep(
    redis_url: str, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit whose coordinator died before its relay sent the entry leaves it on the
    commits' outbox: the relay serving the partition next sends it at its first round, and a
    hand-off of an entry that sweep saw (a commit's reply handled after the sweep's read) is
    not sent again."""

    async def scenario() -> None:
        async with redis_client() as client:
            dead = TaskStore(client)  # no relay told: killed right after the commit
            (lost,) = await _started(dead, "a")
            ((entry_id, _fields),) = await client.xrange(keys.commit_outbox_stream(0))
            publisher = _Recording()
            relay = OutboxRelay(client, publisher, "r2", block_ms=1)
            real = relay_module.read_streams

            async def read_then_hand(redis: Redis, streams: Any, **options: Any) -> Any:
                rows = await real(redis, streams, **options)
                relay.hand(0, [(entry_id.decode(), lost)])
                return rows

            monkeypatch.setattr(relay_module, "read_streams", read_then_hand)
            assert await relay.commits_round() == 1
            assert publisher.sent == [lost]
            assert await client.xlen(keys.commit_outbox_stream(0)) == 0
            await relay.close()

    asyncio.run(scenario())


def test_a_failed_send_of_handed_entries_leaves_them_for_the_next_rounds_sweep(
    redis_url: str, redis_client: Any
) -> None:
    """A handed entry the broker refused stays on the commits' outbox and is sent by the next
    round's sweep, after the ones sent before the failure and without sending those twice."""

    async def scenario() -> None:
        async with redis_client() as client:
            publisher = _Recording()
            relay = OutboxRelay(client, publisher, "r1", block_ms=1, loop_chunk=1, backoff_s=0)
            store = TaskStore(client, dispatched=relay.hand)
            await relay.commits_round()
            first = [*await _started(store, "a"), *await _started(store, "b")]
            publisher.fail_after = 1
            with pytest.raises(PublishError):
                await relay.commits_round()
            assert publisher.sent == first[:1]
            assert await client.xlen(keys.commit_outbox_stream(0)) == 1
            (later,) = await _started(store, "c")  # not sent before the sweep
            assert await relay.commits_round() == 2
            assert publisher.sent == [*first, later]
            assert await client.xlen(keys.commit_outbox_stream(0)) == 0
            await relay.close()

    asyncio.run(scenario())


def test_a_handed_entry_of_a_partition_not_served_is_left_to_its_server(
    redis_url: str, redis_client: Any
) -> None:
    """A commit of a partition the relay no longer serves (its lease lost meanwhile) is not
    sent from the hand-off: it stays on that partition's commits' outbox for its holder."""

    async def scenario() -> None:
        async with redis_client() as client:
            publisher = _Recording()
            served = {0, 1}
            relay = OutboxRelay(
                client, publisher, "r1", block_ms=1, partitions=2, serving=lambda _loop: served
            )
            store = TaskStore(client, partitions=2, dispatched=relay.hand)
            await relay.commits_round()
            task_id = next(t for t in ("a", "b", "c", "d") if store.partition(t) == 1)
            served.discard(1)
            await _started(store, task_id)
            assert await relay.commits_round() == 0
            assert publisher.sent == []
            assert await client.xlen(keys.commit_outbox_stream(1)) == 1
            await relay.close()

    asyncio.run(scenario())


def test_after_a_failed_send_neither_loop_asks_the_broker_before_the_back_off_ends(
    redis_url: str, redis_client: Any
) -> None:
    """A broker that failed a send is not asked again by the relay's other loop during the
    back-off (a stalled broker blocks the event loop once per back-off, not once per loop);
    once it ends, the entries left go out."""

    async def scenario() -> None:
        async with redis_client() as client:
            publisher = _Recording(fail_after=0)
            relay = OutboxRelay(client, publisher, "r1", block_ms=1, backoff_s=0.2)
            store = TaskStore(client, dispatched=relay.hand)
            await relay.commits_round()
            (first,) = await _started(store, "a")
            with pytest.raises(PublishError, match="broker unreachable"):
                await relay.commits_round()
            await _add(client, sample_entry(1))
            publisher.fail_after = 0  # would fail again if asked
            with pytest.raises(PublishError, match="back-off shared"):
                await relay.chained_round(block=False)
            assert publisher.fail_after == 0 and publisher.sent == []
            publisher.fail_after = None
            await asyncio.sleep(0.25)
            assert await relay.relay_once() == 2
            assert {e.id for e in publisher.sent} == {first.id, "id-1"}
            await relay.close()

    asyncio.run(scenario())
