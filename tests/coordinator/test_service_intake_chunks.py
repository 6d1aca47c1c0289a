"""The intake's creates sent in pipelined chunks: every guarantee of a create sent alone kept.

A burst's new tasks are created with their start committed ``intake_chunk`` at a time, one
round trip per chunk (docs/performance.md, "The submission burst's creates in pipelined
chunks"); these tests check what a create sent alone guaranteed: ids and idempotency keys
answered in submission order, a poison entry dead-lettered alone, Redis refusing or
unreachable giving every entry not handled its delivery back, and each task created once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, RedisError

from coordinator.service import Coordinator
from coordinator.store import CreateOutcome, PendingCommit
from shared import keys
from shared.outbox import OutboxEntry
from tests.coordinator.intake_harness import SETTINGS, TASK
from tests.coordinator.intake_harness import coordinator as _coordinator
from tests.coordinator.intake_harness import deliveries as _deliveries
from tests.coordinator.intake_harness import running as _running
from tests.coordinator.intake_harness import submit as _submit
from tests.redis_server import RedisClientFactory


async def _events(client: Redis, name: str) -> list[dict[str, str]]:
    return [f for _i, f in await client.xrange(keys.events_stream(0)) if f.get("event") == name]


def test_a_burst_is_created_in_chunks_each_handed_to_the_relay_before_the_next_is_sent(
    redis_client: RedisClientFactory,
) -> None:
    """Twenty new tasks in one read: their create scripts go in pipelines of 8, 8 and 4; the
    dispatches of each chunk are handed to the relay before the next chunk is sent; each task
    is created started, leased to this coordinator, its entry acknowledged, its record kept."""

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            handed: list[str] = []

            def hand(_partition: int, entries: Sequence[tuple[str, OutboxEntry]]) -> None:
                handed.extend(entry_id for entry_id, _e in entries)

            coordinator.store.dispatched = hand
            sent = coordinator.store.create_started_many
            chunks: list[tuple[list[str], int]] = []

            async def spy(
                pending: Sequence[PendingCommit],
            ) -> list[CreateOutcome | RedisError | None]:
                chunks.append(([p.record.task_id for p in pending], len(handed)))
                return await sent(pending)

            coordinator.store.create_started_many = spy  # type: ignore[method-assign]
            ids = [f"t{n:02d}" for n in range(20)]
            for task_id in ids:
                await _submit(client, task_id)
            await coordinator._intake_once()
            assert chunks == [(ids[:8], 0), (ids[8:16], 8), (ids[16:], 16)]
            assert len(handed) == 20
            for task_id in ids:
                assert await _running(client, task_id)
                assert await client.get(keys.lease_key(task_id, 0)) == "c"
                assert coordinator.store.peek_kept(task_id) is not None
            assert coordinator._held == set(ids)
            assert await _deliveries(client) == {}
            assert await client.xlen(keys.commit_outbox_stream(0)) == 20
            assert len(await _events(client, "accepted")) == 20

    asyncio.run(run())


def test_ids_and_keys_repeated_within_one_chunk_are_answered_as_when_sent_apart(
    redis_client: RedisClientFactory,
) -> None:
    """In one chunk: ``a``, ``a`` again (a duplicate), ``b`` with ``a``'s key (an alias of
    ``a``), ``c`` with key ``k-c``, then ``c`` with ``a``'s key (refused naming both): the
    scripts run in submission order, so each answer is the one a create sent alone gets."""

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            await _submit(client, "a", {**TASK, "idempotency_key": "k-a"})
            await _submit(client, "a", {**TASK, "idempotency_key": "k-a"})
            await _submit(client, "b", {**TASK, "idempotency_key": "k-a"})
            await _submit(client, "c", {**TASK, "idempotency_key": "k-c"})
            await _submit(client, "c", {**TASK, "idempotency_key": "k-a"})
            await coordinator._intake_once()
            assert await _running(client, "a") and await _running(client, "c")
            assert await client.hgetall(keys.task_key("b", 0)) == {"alias_of": "a"}
            assert len(await _events(client, "accepted")) == 2
            duplicates = await _events(client, "duplicate")
            assert [(d["task_id"], d["existing_task_id"]) for d in duplicates] == [
                ("a", "a"),
                ("b", "a"),
            ]
            (rejected,) = [f for _i, f in await client.xrange(keys.rejected_stream(0))]
            assert rejected["task_id"] == "c" and "belongs to task 'a'" in rejected["error"]
            assert await _deliveries(client) == {}
            assert coordinator._held == {"a", "c"}

    asyncio.run(run())


def test_a_poison_entry_of_a_chunk_is_dead_lettered_alone(
    redis_client: RedisClientFactory,
) -> None:
    """An unexpected error while preparing one task's create, or while finishing another's
    (its duplicate told), dead-letters that entry alone: the others of the chunk are created,
    started and acknowledged."""

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            await _submit(client, "live")
            await coordinator._intake_once()
            prepare = coordinator._prepare_started

            def failing(record: Any, ack: Any) -> PendingCommit | None:
                if record.task_id == "bad":
                    raise ValueError("cannot prepare bad")
                return prepare(record, ack)

            async def duplicate(_task_id: str, _existing: str) -> None:
                raise ValueError("cannot tell the duplicate")

            coordinator._prepare_started = failing  # type: ignore[method-assign]
            coordinator._duplicate = duplicate  # type: ignore[method-assign]
            for task_id in ("a", "bad", "b", "live", "c"):
                await _submit(client, task_id)
            await coordinator._intake_once()
            for task_id in ("a", "b", "c"):
                assert await _running(client, task_id)
            assert not await client.exists(keys.task_key("bad", 0))
            dead = [f for _i, f in await client.xrange(keys.dead_letter_stream(0))]
            assert sorted((d["raw_task_id"], "ValueError" in d["error"]) for d in dead) == [
                ("bad", True),
                ("live", True),
            ]
            assert await _deliveries(client) == {}

    asyncio.run(run())


def test_a_connection_lost_on_a_chunk_gives_each_entry_not_handled_back(
    redis_client: RedisClientFactory,
) -> None:
    """Twelve entries, the first chunk's pipeline losing its connection: no task is created,
    each of the twelve is given its delivery back (the chunk's eight, and the four not
    reached: none counted towards poison), and a later claim creates each once."""

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            sent = coordinator.store.create_started_many

            async def lost(_pending: Sequence[PendingCommit]) -> list[Any]:
                raise RedisConnectionError("Connection closed by server.")

            coordinator.store.create_started_many = lost  # type: ignore[method-assign]
            ids = [f"t{n:02d}" for n in range(12)]
            for task_id in ids:
                await _submit(client, task_id)
            raised = None
            try:
                await coordinator._intake_once()
            except RedisConnectionError as exc:
                raised = exc
            assert raised is not None
            deliveries = await _deliveries(client)
            assert len(deliveries) == 12 and set(deliveries.values()) == {0}
            assert not any([await client.exists(keys.task_key(t, 0)) for t in ids])
            coordinator.store.create_started_many = sent  # type: ignore[method-assign]
            await asyncio.sleep(0.12)  # claimable again after transient_backoff_ms
            await coordinator._tick_once()
            for task_id in ids:
                assert await _running(client, task_id)
            assert len(await _events(client, "accepted")) == 12
            assert await _deliveries(client) == {}

    asyncio.run(run())


def test_redis_refusing_one_create_of_a_chunk_gives_that_entry_back_and_keeps_the_others(
    redis_client: RedisClientFactory,
) -> None:
    """One script of a chunk answered out of memory: the others are created and started, the
    refused entry gets its delivery back (none counted towards poison), the error is raised
    once the chunk is done, and a later claim creates the refused task."""

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            sent = coordinator.store.create_started_many

            async def refusing_b(
                pending: Sequence[PendingCommit],
            ) -> list[CreateOutcome | RedisError | None]:
                others = await sent([p for p in pending if p.record.task_id != "b"])
                refused = OutOfMemoryError(
                    "OOM command not allowed when used memory > 'maxmemory'."
                )
                outcomes: list[CreateOutcome | RedisError | None] = []
                for p in pending:
                    outcomes.append(refused if p.record.task_id == "b" else others.pop(0))
                return outcomes

            coordinator.store.create_started_many = refusing_b  # type: ignore[method-assign]
            entries = {t: await _submit(client, t) for t in ("a", "b", "c")}
            raised = None
            try:
                await coordinator._intake_once()
            except OutOfMemoryError as exc:
                raised = exc
            assert raised is not None
            assert await _running(client, "a") and await _running(client, "c")
            assert not await client.exists(keys.task_key("b", 0))
            assert await _deliveries(client) == {entries["b"]: 0}
            coordinator.store.create_started_many = sent  # type: ignore[method-assign]
            await asyncio.sleep(0.12)
            await coordinator._tick_once()
            assert await _running(client, "b")
            assert await _deliveries(client) == {}
            assert len(await _events(client, "accepted")) == 3

    asyncio.run(run())


class _Recorded:
    """A transport that keeps what it is asked to send."""

    def __init__(self) -> None:
        self.sent: list[OutboxEntry] = []

    def publish(self, entries: Sequence[OutboxEntry]) -> None:
        self.sent.extend(entries)


def test_a_chunks_dispatches_are_published_by_the_relay_before_the_next_chunk_is_sent(
    redis_client: RedisClientFactory,
) -> None:
    """With the coordinator's relay running beside the intake, each chunk's dispatches are
    published (not only handed) before the next chunk's scripts are sent: the intake lets the
    relay run between chunks, and the relay wakes at the loop's next turn."""

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            transport = _Recorded()
            coordinator = Coordinator(client, publisher=transport, settings=SETTINGS, name="c")
            await coordinator._ensure_groups()
            await coordinator._learn_redis_version()
            assert coordinator.relay is not None
            relay = asyncio.create_task(coordinator.relay.run(coordinator._stopping))
            await asyncio.sleep(0.05)  # its first round's sweep done: it waits for hand-offs
            sent = coordinator.store.create_started_many
            published: list[int] = []

            async def spy(
                pending: Sequence[PendingCommit],
            ) -> list[CreateOutcome | RedisError | None]:
                published.append(len(transport.sent))
                return await sent(pending)

            coordinator.store.create_started_many = spy  # type: ignore[method-assign]
            for n in range(20):
                await _submit(client, f"t{n:02d}")
            await coordinator._intake_once()
            coordinator._stopping.set()
            await asyncio.wait_for(relay, 5)
            assert published == [0, 8, 16]
            assert len(transport.sent) == 20

    asyncio.run(run())


def test_an_error_after_a_create_lands_on_its_entry_not_on_the_one_that_sent_the_chunk(
    redis_client: RedisClientFactory,
) -> None:
    """``a`` then ``b`` with ``a``'s key: ``b`` sends the chunk holding ``a`` before its own
    create is prepared. The bookkeeping after ``a``'s create raises: ``a`` is dead-lettered
    (its task created and running), ``b`` is answered as ``a``'s duplicate, not dead-lettered
    for an error that was ``a``'s."""

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            committed = coordinator._committed

            def failing(pending: PendingCommit) -> None:
                if pending.record.task_id == "a":
                    raise ValueError("bookkeeping failed for a")
                committed(pending)

            coordinator._committed = failing  # type: ignore[method-assign]
            await _submit(client, "a", {**TASK, "idempotency_key": "k"})
            await _submit(client, "b", {**TASK, "idempotency_key": "k"})
            await coordinator._intake_once()
            assert await _running(client, "a")
            assert await client.hgetall(keys.task_key("b", 0)) == {"alias_of": "a"}
            dead = [f for _i, f in await client.xrange(keys.dead_letter_stream(0))]
            assert [d["raw_task_id"] for d in dead] == ["a"]
            duplicates = await _events(client, "duplicate")
            assert [(d["task_id"], d["existing_task_id"]) for d in duplicates] == [("b", "a")]
            assert await _deliveries(client) == {}

    asyncio.run(run())


def test_a_stop_while_telling_a_duplicate_still_tells_the_chunks_later_duplicates(
    redis_client: RedisClientFactory,
) -> None:
    """The coordinator's intake task is cancelled (a stop) while the event telling the first
    duplicate of a chunk is in flight: the later duplicates of that chunk, whose scripts
    acknowledged their entries, are told before the cancellation propagates, and the
    cancellation is not swallowed."""

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            for task_id in ("a", "b", "c"):
                await _submit(client, task_id)
            await coordinator._intake_once()
            entered = asyncio.Event()
            execute_command = client.execute_command

            async def stalling(*args: Any, **options: Any) -> Any:
                if str(args[0]).upper() == "XADD" and "duplicate" in args and "a" in args:
                    entered.set()
                    await asyncio.get_running_loop().create_future()  # until cancelled
                return await execute_command(*args, **options)

            client.execute_command = stalling  # type: ignore[method-assign]
            for task_id in ("a", "b", "n", "c"):
                await _submit(client, task_id)
            intake = asyncio.create_task(coordinator._intake_once())
            await asyncio.wait_for(entered.wait(), 5)
            intake.cancel()
            try:
                await intake
            except asyncio.CancelledError:
                pass
            else:
                raise AssertionError("the cancellation was swallowed")
            assert sorted(e["task_id"] for e in await _events(client, "duplicate")) == ["b", "c"]
            assert await _deliveries(client) == {}
            assert await client.hget(keys.task_key("n", 0), "status") == "running"

    asyncio.run(run())
