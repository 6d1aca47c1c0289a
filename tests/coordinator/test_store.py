"""The task store on a real Redis: atomic commits, conflicts, leases and retention."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from coordinator.machine import MachineSettings, TaskMachine
from coordinator.state import TaskRecord, TaskStatus
from coordinator.store import RENEW_HELD_CHUNK, CommitConflictError, TaskStore
from shared import keys
from shared.events import ObservationsCollected
from shared.task_spec import parse_task


def _record(task_id: str, idem: str | None = None) -> TaskRecord:
    spec = parse_task(
        {"goal": "g", "idempotency_key": idem, "steps": [{"id": "s", "instruction": "x"}]}
    )
    return TaskRecord(task_id=task_id, spec=spec, created_at=10.0, updated_at=10.0)


def _machine(record: TaskRecord, now: float = 11.0) -> TaskMachine:
    return TaskMachine(record, now, MachineSettings(workspace_root="/ws"))


def _scenario(redis_url: str, body: Any) -> None:
    async def run() -> None:
        client = Redis.from_url(redis_url)
        try:
            await body(client, TaskStore(client))
        finally:
            await client.aclose()

    asyncio.run(run())


def test_create_honours_the_idempotency_key(redis_url: str, redis_client: Any) -> None:
    """A second task with the same idempotency key is not created; the first id comes back."""

    async def body(client: Redis, store: TaskStore) -> None:
        first = await store.create(_record("a", idem="k"))
        second = await store.create(_record("b", idem="k"))
        assert first.created and not second.created and second.task_id == "a"
        assert await store.load("b") is None

    _scenario(redis_url, body)


def test_a_commits_journal_records_share_one_stream_entry(
    redis_url: str, redis_client: Any
) -> None:
    """The records of one commit are one stream entry (id ``0-{last+1}``): the client reads
    them back in order, after any sequence (one in the middle of an entry too) and counted
    in records; the sequence key holds the last one."""
    from coordinator.client import OrgaClient

    async def body(client: Redis, store: TaskStore) -> None:
        record = _record("j")
        await store.create(record)
        machine = _machine(record)
        effects = machine.start()
        for n in (1, 2):  # two more records in the same commit
            machine.journal(ObservationsCollected(iteration=0, observation_count=n))
        assert len(effects.journal) >= 3
        await store.commit(machine.record, effects)
        rows = await client.xrange(keys.journal_stream("j", 0))
        assert len(rows) == 1
        sequences = [e.sequence for e in effects.journal]
        assert rows[0][0] == f"0-{sequences[-1] + 1}".encode()
        # The entry's id is the journal's last sequence: no companion key is written.
        assert await client.exists(keys.journal_sequence_key("j", 0)) == 0
        sync = OrgaClient(redis_url)
        try:
            assert [e.sequence for e in sync.journal("j")] == sequences
            assert [e.sequence for e in sync.journal("j", after=sequences[0])] == sequences[1:]
            assert [e.sequence for e in sync.journal("j", count=1)] == sequences[:1]
        finally:
            sync.close()

    _scenario(redis_url, body)


def test_a_commit_writes_no_active_set_and_the_start_deletes_no_conversation(
    redis_url: str, redis_client: Any
) -> None:
    """Which tasks are active is the deadline index's membership: no commit writes a set
    (no SADD, no SREM: issue 27, branch ``actset``), and the start (pending -> running)
    deletes no conversation (a record at version 0 has none stored); the task stays active
    while it runs, and the commit that ends it takes it out."""

    async def calls(client: Redis, command: str) -> int:
        stats = await client.info("commandstats")
        return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))

    async def body(client: Redis, store: TaskStore) -> None:
        record = _record("live")
        sets = (await calls(client, "sadd"), await calls(client, "srem"))  # the session's so far
        await store.create(record)
        machine = _machine(record)
        deletes = await calls(client, "del")
        await store.commit(machine.record, machine.start())  # pending -> running
        assert await calls(client, "del") == deletes
        assert await store.still_active(["live"]) == [True]
        stored = await store.load("live")
        assert stored is not None and stored.conversation.messages  # the start's, written
        assert stored.conversation.messages == machine.record.conversation.messages
        same = _machine(record, now=12.0)
        same.record.error = "touched"
        await store.commit(same.record, same.effects)  # still running
        assert await store.still_active(["live"]) == [True]
        ended = _machine(record, now=13.0)
        await store.commit(ended.record, ended.cancel("stop"))
        assert ended.record.terminal
        assert await store.still_active(["live"]) == [False]
        assert (await calls(client, "sadd"), await calls(client, "srem")) == sets
        assert await client.exists(f"orga:{keys.partition_tag(0)}:tasks:active") == 0  # unused

    _scenario(redis_url, body)


def test_a_task_is_in_the_deadline_index_from_its_creation_to_its_end(
    redis_url: str, redis_client: Any
) -> None:
    """The deadline index holds every active task and only those (it says which are active:
    ``still_active``, ``active_task_ids``, the held leases' renewal): a task created started,
    a sub-agent's created apart (pending until its start), one awaiting a human review (no
    dispatch awaited) are in it from their creation; each leaves it at its end, a worker's
    late pull (``ZADD XX LT``) does not put it back, and the renewal reports each ended
    (releasing a lease its end left, when the renewing owner holds it)."""

    async def body(client: Redis, store: TaskStore) -> None:
        await client.config_resetstat()
        sets = (0, 0)  # counted from here
        lease = ("c1", 60_000)
        root = _record("root")
        started = _machine(root)
        created = await store.create_started(
            store.prepare(started.record, started.start(), create=lease)
        )
        assert created is not None and created.started
        child = _record("root.1")  # a sub-agent's: created apart, pending
        assert (await store.create(child, lease=lease)).leased
        reviewed = _record("reviewed")
        assert (await store.create(reviewed, lease=lease)).leased
        ids = ["reviewed", "root", "root.1"]
        assert await store.active_task_ids() == ids
        assert await store.still_active(ids) == [True] * 3
        assert await client.zscore(keys.deadlines_key(0), "root.1") == 10.0  # to be started
        assert await store.due_task_ids(now=10.0, limit=10) == ["reviewed", "root.1"]
        for record in (child, reviewed):
            machine = _machine(record)
            await store.commit(machine.record, machine.start())
        machine = _machine(reviewed, now=12.0)
        machine.reviews.escalate("tracker", "a human decides")
        await store.commit(machine.record, machine.done())
        assert reviewed.status is TaskStatus.AWAITING_REVIEW and reviewed.awaiting is None
        assert reviewed.review is not None
        assert await client.zscore(keys.deadlines_key(0), "reviewed") == reviewed.review.deadline
        assert await store.still_active(ids) == [True] * 3
        assert await store.renew_held(ids, "c1", 60_000) == ([], [])

        records = {"reviewed": reviewed, "root": root, "root.1": child}
        for n, task_id in enumerate(ids):
            ending = _machine(records[task_id], now=20.0 + n)
            await store.commit(ending.record, ending.cancel("stop"))  # its lease left to expire
            assert ending.record.terminal
            assert await store.still_active([task_id]) == [False]
        assert await store.active_task_ids() == []
        assert await client.zadd(keys.deadlines_key(0), {"root": 1.0}, xx=True, lt=True) == 0
        assert await client.zscore(keys.deadlines_key(0), "root") is None  # XX added nothing
        assert await store.still_active(ids) == [False] * 3
        assert await client.get(keys.lease_key("root", 0)) == b"c1"
        assert await store.renew_held(ids, "c1", 60_000) == ([], ids)
        for task_id in ids:  # the renewal released the leases the ends left
            assert await client.exists(keys.lease_key(task_id, 0)) == 0
        stats = await client.info("commandstats")
        after = tuple(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("sadd", "srem"))
        assert after == sets  # no set written by this scenario

    _scenario(redis_url, body)


def test_a_change_of_status_is_one_count_and_the_purge_takes_it_out(
    redis_url: str, redis_client: Any
) -> None:
    """The status counts: a creation adds its status, a commit that changes the status sends
    one ``HINCRBY`` (a ``{from}>{to}`` field), one that keeps it none; read as tasks per status
    (the ``orga_tasks`` gauge), and a purged task leaves its status's count."""

    async def hincrbys(client: Redis) -> int:
        stats = await client.info("commandstats")
        return int(stats.get("cmdstat_hincrby", {}).get("calls", 0))

    async def counts(client: Redis) -> dict[str, int]:
        return keys.status_counts(await client.hgetall(keys.status_counts_key(0)))

    async def body(client: Redis, store: TaskStore) -> None:
        record = _record("t")
        await store.create(record)
        assert await counts(client) == {"pending": 1}
        machine = _machine(record)
        before = await hincrbys(client)
        await store.commit(machine.record, machine.start())
        assert await hincrbys(client) == before + 1
        assert await counts(client) == {"pending": 0, "running": 1}
        same = _machine(record, now=12.0)
        same.record.error = "touched"
        await store.commit(same.record, same.effects)
        assert await hincrbys(client) == before + 1
        ended = _machine(record, now=13.0)
        await store.commit(ended.record, ended.cancel("stop"))
        assert await hincrbys(client) == before + 2
        assert await counts(client) == {"pending": 0, "running": 0, "aborted": 1}
        assert await store.purge_finished(100.0) == 1
        assert await counts(client) == {"pending": 0, "running": 0, "aborted": 0}

    _scenario(redis_url, body)


def test_status_counts_read_moves_as_minus_one_and_plus_one() -> None:
    """``{from}>{to}`` fields move their value; plain fields add theirs (an older version's
    ``-1``/``+1`` pairs read the same), bytes or text."""
    stored = {
        b"pending": b"3",
        b"pending>running": b"2",
        b"running>completed": b"1",
        b"running": b"-1",
    }
    assert keys.status_counts(stored) == {"pending": 1, "running": 0, "completed": 1}
    assert keys.status_counts({"failed": "2"}) == {"failed": 2}
    assert keys.status_counts({}) == {}


def test_commit_is_compare_and_set(redis_url: str, redis_client: Any) -> None:
    """A commit from a stale version is refused and writes nothing."""

    async def body(client: Redis, store: TaskStore) -> None:
        record = _record("t")
        await store.create(record)
        stale = record.model_copy(deep=True)
        machine = _machine(record)
        await store.commit(machine.record, machine.start())
        other = _machine(stale)
        with pytest.raises(CommitConflictError):
            await store.commit(other.record, other.start())
        assert await client.xlen(keys.journal_stream("t", 0)) == 1
        loaded = await store.load("t")
        assert loaded is not None and loaded.version == 1

    _scenario(redis_url, body)


def test_a_record_of_another_task_of_that_id_at_the_same_version_is_refused(
    redis_url: str, redis_client: Any
) -> None:
    """A commit is checked on the task's creation time as well as its version: the record of
    a purged task is refused on a new task of that id at the same version (nothing written),
    and neither ``is_current`` nor ``load`` takes it for the stored one."""

    async def body(client: Redis, store: TaskStore) -> None:
        old = _record("t")
        await store.create(old)
        await client.delete(keys.task_key("t", 0))  # purged; a new task of that id created
        other = TaskStore(client)
        new = _record("t").model_copy(update={"created_at": 20.0})
        await other.create(new)
        assert old.version == new.version == 0
        assert not await store.is_current(old)
        machine = _machine(old)
        with pytest.raises(CommitConflictError):
            await store.commit(machine.record, machine.start())
        assert await client.xlen(keys.journal_stream("t", 0)) == 0
        loaded = await store.load("t")
        assert loaded is not None and loaded.created_at == 20.0

    _scenario(redis_url, body)


def test_a_task_stored_without_its_creation_time_is_confirmed_by_version_then_stamped(
    redis_url: str, redis_client: Any
) -> None:
    """A task created before ``created_at`` was stored in its hash is committed as before
    (confirmed by its version alone); that commit writes its ``created_at``."""

    async def body(client: Redis, store: TaskStore) -> None:
        record = _record("t")
        await store.create(record)
        await client.hdel(keys.task_key("t", 0), "created_at")
        assert await store.is_current(record)
        machine = _machine(record)
        await store.commit(machine.record, machine.start())
        assert await client.hget(keys.task_key("t", 0), "created_at") == b"10.000000"
        assert await store.is_current(machine.record)

    _scenario(redis_url, body)


def test_leases_are_exclusive_and_renewable(redis_url: str, redis_client: Any) -> None:
    """Only one coordinator holds a lease; only the holder renews or releases it."""

    async def body(client: Redis, store: TaskStore) -> None:
        assert await store.acquire_lease("t", "c1", 10_000)
        assert not await store.acquire_lease("t", "c2", 10_000)
        assert not await store.renew_lease("t", "c2", 10_000)
        assert await store.renew_lease("t", "c1", 10_000)
        await store.release_lease("t", "c2")
        assert not await store.acquire_lease("t", "c2", 10_000)
        await store.release_lease("t", "c1")
        assert await store.acquire_lease("t", "c2", 10_000)

    _scenario(redis_url, body)


def test_a_lease_its_owner_already_holds_is_acquired_again(
    redis_url: str, redis_client: Any
) -> None:
    """Taking a lease one already holds (a create's lease whose reply was lost) succeeds and
    refreshes its TTL; another owner still cannot take it."""

    async def body(client: Redis, store: TaskStore) -> None:
        assert await store.acquire_lease("t", "c1", 1_000)
        assert await store.acquire_lease("t", "c1", 60_000)
        assert await client.pttl(keys.lease_key("t", 0)) > 1_000
        assert not await store.acquire_lease("t", "c2", 10_000)
        assert await client.get(keys.lease_key("t", 0)) in {"c1", b"c1"}

    _scenario(redis_url, body)


def test_renewals_survive_redis_losing_the_scripts(redis_url: str, redis_client: Any) -> None:
    """Renewals and releases sent as bare EVALSHA are sent again (loading the script) when
    Redis answers NOSCRIPT."""

    async def body(client: Redis, store: TaskStore) -> None:
        assert await store.acquire_lease("a", "c1", 1_000)
        assert await store.acquire_lease("b", "c2", 1_000)
        assert await store.acquire_lease("d", "c1", 1_000)
        await client.script_flush()
        renewed = await store.renew_leases(["a", "b"], "c1", 60_000, release=["d"])
        assert renewed == [True, False]
        assert await client.pttl(keys.lease_key("a", 0)) > 1_000
        assert await client.exists(keys.lease_key("d", 0)) == 0
        assert await store.renew_leases(["a"], "c1", 60_000) == [True]

    _scenario(redis_url, body)


def test_held_leases_are_renewed_in_one_call_per_partition(
    redis_url: str, redis_client: Any
) -> None:
    """The periodic renewal: a held lease of an active task is renewed, one taken over (or
    expired) is reported lost and left to its holder, an ended task's lease is released and the
    task reported ended (a lease of another owner on an ended task is left alone); tasks of
    several partitions, more than one chunk of them, one script call per partition and chunk."""

    async def run() -> None:
        client = Redis.from_url(redis_url)
        try:
            store = TaskStore(client, partitions=2)
            ids = [f"t{n}" for n in range(2 * RENEW_HELD_CHUNK + 100)]
            for task_id in ids:
                await client.zadd(keys.deadlines_key(store.partition(task_id)), {task_id: 1e12})
                assert await store.acquire_lease(task_id, "c1", 1_000)
            lost, ended, foreign_end = ids[0], ids[1], ids[2]
            await client.set(keys.lease_key(lost, store.partition(lost)), "c2")
            await client.set(keys.lease_key(foreign_end, store.partition(foreign_end)), "c2")
            for task_id in (ended, foreign_end):
                await client.zrem(keys.deadlines_key(store.partition(task_id)), task_id)
            await client.delete(keys.lease_key(ids[3], store.partition(ids[3])))  # expired
            assert await store.renew_held(ids[-1:], "c1", 1_000) == ([], [])  # loads the script
            await client.config_resetstat()
            got_lost, got_ended = await store.renew_held(ids, "c1", 60_000)
            calls = (await client.info("commandstats"))["cmdstat_evalsha"]["calls"]
            sizes = Counter(store.partition(t) for t in ids)
            assert len(sizes) == 2 and max(sizes.values()) > RENEW_HELD_CHUNK
            assert calls == sum(-(-n // RENEW_HELD_CHUNK) for n in sizes.values())
            assert sorted(got_lost) == sorted([lost, ids[3]])
            assert sorted(got_ended) == sorted([ended, foreign_end])
            for task_id in ids[4:]:
                assert await client.pttl(keys.lease_key(task_id, store.partition(task_id))) > 1_000
            assert await client.get(keys.lease_key(lost, store.partition(lost))) == b"c2"
            assert await client.exists(keys.lease_key(ended, store.partition(ended))) == 0
            assert await client.get(keys.lease_key(foreign_end, store.partition(foreign_end))) == (
                b"c2"
            )
            await client.script_flush()  # Redis lost the script: sent again, loading it
            assert await store.renew_held(ids[4:], "c1", 60_000) == ([], [])
            assert await store.renew_held([], "c1", 60_000) == ([], [])
        finally:
            await client.aclose()

    asyncio.run(run())


def test_finished_tasks_are_purged_after_the_retention(redis_url: str, redis_client: Any) -> None:
    """A task that ended before the cut-off loses its state and journal; a running one stays."""

    async def body(client: Redis, store: TaskStore) -> None:
        done, running = _record("done"), _record("running")
        for record in (done, running):
            await store.create(record)
            machine = _machine(record)
            await store.commit(machine.record, machine.start())
        machine = _machine(done, now=12.0)
        await store.commit(machine.record, machine.cancel("test"))
        assert await store.still_active(["done", "running"]) == [False, True]
        assert await store.purge_finished(finished_before=11.5) == 0
        assert await store.purge_finished(finished_before=13.0) == 1
        assert await store.load("done") is None
        assert await client.exists(keys.journal_stream("done", 0)) == 0
        assert await store.load("running") is not None

    _scenario(redis_url, body)


def test_the_conversation_is_stored_append_only_and_rewritten_after_compaction(
    redis_url: str, redis_client: Any
) -> None:
    """A commit writes only the new messages; a rewrite bumps the epoch; load restores it."""
    from shared.conversation import ConversationMessage

    async def body(client: Redis, store: TaskStore) -> None:
        record = _record("conv")
        await store.create(record)
        machine = _machine(record)
        await store.commit(machine.record, machine.start())
        key = keys.conversation_key("conv", 0)
        first = await client.lrange(key, 0, -1)
        assert len(first) == len(record.conversation) == 3
        assert record.conversation_epoch == 1  # the first write is a whole one
        record.conversation.push(ConversationMessage.user("one more"))
        delta = store.conversation_delta(record)
        assert not delta.rewrite and len(delta.messages) == 1
        await store.commit(record, _machine(record).effects, delta=delta)
        assert await client.lrange(key, 0, 2) == first  # untouched, one appended
        assert await client.llen(key) == 4 and record.conversation_epoch == 1
        record.conversation.messages[3] = ConversationMessage.user("masked")  # a compaction
        await store.commit(record, _machine(record).effects)
        assert record.conversation_epoch == 2
        assert b"masked" in (await client.lrange(key, 3, 3))[0]
        fresh = TaskStore(client)
        loaded = await fresh.load("conv")
        assert loaded is not None
        assert [m.content for m in loaded.conversation.messages] == [
            m.content for m in record.conversation.messages
        ]
        assert b"one more" not in await client.hget(keys.task_key("conv", 0), "state")

    _scenario(redis_url, body)


def test_a_commit_of_hundreds_of_messages_keeps_them_in_order(
    redis_url: str, redis_client: Any
) -> None:
    """The commit pushes a conversation's messages 256 to an RPUSH: 600 appended at once
    arrive whole and in order, and the journal's last sequence is the last entry's."""
    from shared.conversation import ConversationMessage

    async def body(client: Redis, store: TaskStore) -> None:
        record = _record("many")
        await store.create(record)
        machine = _machine(record)
        await store.commit(machine.record, machine.start())
        for n in range(600):
            record.conversation.push(ConversationMessage.user(f"message {n}"))
        delta = store.conversation_delta(record)
        assert not delta.rewrite and len(delta.messages) == 600
        await store.commit(record, _machine(record).effects, delta=delta)
        loaded = await TaskStore(client).load("many")
        assert loaded is not None
        assert [m.content for m in loaded.conversation.messages] == [
            m.content for m in record.conversation.messages
        ]
        last = await client.xrevrange(keys.journal_stream("many", 0), count=1)
        assert last[0][0] == f"0-{int(last[0][1][b'sequence']) + 1}".encode()
        assert int(last[0][1][b"sequence"]) == record.journal_seq - 1

    _scenario(redis_url, body)


def test_a_record_written_before_conversations_were_stored_apart_keeps_its_conversation(
    redis_url: str, redis_client: Any
) -> None:
    """Upgrading: a state that holds the conversation itself loads with it, and the next
    commit stores it whole in the list."""
    import json as json_

    async def body(client: Redis, store: TaskStore) -> None:
        record = _record("old")
        _machine(record).start()
        state = json_.loads(record.model_dump_json())
        state["conversation"] = json_.loads(record.conversation.model_dump_json())
        await client.hset(
            keys.task_key("old", 0), mapping={"version": "0", "state": json_.dumps(state)}
        )
        loaded = await TaskStore(client).load("old")
        assert loaded is not None and len(loaded.conversation) == len(record.conversation) > 0
        await store.commit(loaded, _machine(loaded).effects)
        assert await client.llen(keys.conversation_key("old", 0)) == len(record.conversation)

    _scenario(redis_url, body)


def test_the_state_written_is_the_records_json_byte_for_byte(
    redis_url: str, redis_client: Any
) -> None:
    """The spec's JSON kept per task and spliced in gives exactly ``model_dump_json``,
    commit after commit."""

    async def body(client: Redis, store: TaskStore) -> None:
        for task_id in ("plain", "t.1-x_2"):
            await store.create(_record(task_id))
            record = await store.load(task_id)
            assert record is not None
            for now, step in ((11.0, "start"), (12.0, "cancel")):
                machine = _machine(record, now)
                effects = machine.start() if step == "start" else machine.cancel("stop")
                await store.commit(machine.record, effects)
                state = await client.hget(keys.task_key(task_id, 0), "state")
                assert state == record.model_dump_json().encode()

    _scenario(redis_url, body)


def test_create_takes_the_lease_and_the_last_commit_leaves_it_to_expire(
    redis_url: str, redis_client: Any
) -> None:
    """``create`` with a lease takes it only for a task it creates and nobody holds; the
    terminal commit leaves the lease as it is, whoever holds it, to expire by its TTL (it
    guards nothing once the task ended: no ``DEL``, one command less per task)."""

    async def body(client: Redis, store: TaskStore) -> None:
        first = await store.create(_record("a"), lease=("c1", 10_000))
        again = await store.create(_record("a"), lease=("c2", 10_000))
        assert first.created and first.leased
        assert not again.created and not again.leased
        assert await client.get(keys.lease_key("a", 0)) == b"c1"
        await client.set(keys.lease_key("b", 0), "c2", px=10_000)  # held before the task exists
        assert not (await store.create(_record("b"), lease=("c1", 10_000))).leased
        for task_id, holder in (("a", b"c1"), ("b", b"c2")):
            record = await store.load(task_id)
            assert record is not None
            machine = _machine(record)
            await client.config_resetstat()
            await store.commit(machine.record, machine.cancel("stop"))
            stats = await client.info("commandstats")
            assert "cmdstat_del" not in stats, "the terminal commit deleted the lease"
            assert await client.get(keys.lease_key(task_id, 0)) == holder
            assert 0 < await client.pttl(keys.lease_key(task_id, 0)) <= 10_000

    _scenario(redis_url, body)


def test_on_16_partitions_each_script_touches_one_slot_and_the_views_merge(
    redis_url: str, redis_client: Any
) -> None:
    """Every key a commit names is in its task's partition (a child's in its root's, so its
    ``child_finished`` for the parent stays in the slot); active, due, finished and purged
    tasks are found in whichever partition they are."""

    async def run() -> None:
        client = Redis.from_url(redis_url)
        store = TaskStore(client, partitions=16)
        try:
            ids = ["root", "root.1", "root.1.2", "other", "third"]
            pending = []
            for task_id in ids:
                record = _record(task_id)
                await store.create(record)
                machine = _machine(record)
                pending.append(store.prepare(machine.record, machine.start()))
            for commit in pending:
                tag = keys.partition_tag(store.partition(commit.record.task_id))
                assert all(f":{tag}:" in key for key in commit.keys), commit.keys
            assert len({keys.partition_of(t, 16) for t in ids}) > 1
            assert {keys.partition_of(t, 16) for t in ids[:3]} == {keys.partition_of("root", 16)}
            await store.commit_many(pending)
            assert await store.active_task_ids() == sorted(ids)
            assert sorted(await store.due_task_ids(now=1e12, limit=100)) == sorted(ids)
            assert await store.still_active(ids) == [True] * len(ids)
            machine = _machine(await store.load("other") or _record("x"), now=12.0)
            await store.commit(machine.record, machine.cancel("test"))
            assert await store.purge_finished(finished_before=13.0) == 1
            assert await store.load("other") is None
            assert await store.active_task_ids() == sorted(set(ids) - {"other"})
        finally:
            await client.aclose()

    asyncio.run(run())


async def _observed(
    client: Redis, store: TaskStore, task_id: str, *, delete_now: bool = False
) -> str:
    """Create and start ``task_id``, then commit a change applying an observation entry read
    by the coordinators' group (deleted by the commit with ``delete_now``); the entry's id."""
    stream = keys.observations_stream(0)
    with contextlib.suppress(ResponseError):  # the group exists already
        await client.xgroup_create(stream, keys.coordinator_group, id="0", mkstream=True)
    record = _record(task_id)
    await store.create(record)
    machine = _machine(record)
    await store.commit(machine.record, machine.start())
    entry_id = (await client.xadd(stream, {"x": "1"})).decode()
    await client.xreadgroup(keys.coordinator_group, "c", {stream: ">"})
    touched = _machine(machine.record)
    touched.record.error = "touched"
    ack = (stream, keys.coordinator_group, entry_id)
    pending = store.prepare(touched.record, touched.effects, ack, delete_now=delete_now)
    await store.commit_prepared(pending)
    return entry_id


@pytest.mark.parametrize("acknowledge", [True, False])
def test_observations_applied_are_deleted_together_once_due(
    redis_url: str, redis_client: Any, acknowledge: bool
) -> None:
    """A commit applying an observation leaves it in the stream (pending); ``delete_applied``
    deletes those applied, one ``XDEL`` for all of them, once the oldest is ``older_than_s``
    old (acknowledged too when ``acknowledge_deleted``)."""

    async def body(client: Redis, store: TaskStore) -> None:
        stream = keys.observations_stream(0)
        store.acknowledge_deleted = acknowledge
        for task_id in ("t1", "t2", "t3"):
            await _observed(client, store, task_id)
        assert (await client.xpending(stream, keys.coordinator_group))["pending"] == 3
        assert await client.xlen(stream) == 3  # applied, not deleted yet
        assert await store.delete_applied(older_than_s=3600) == 0
        assert await client.xlen(stream) == 3
        before = (await client.info("commandstats")).get("cmdstat_xdel", {}).get("calls", 0)
        assert await store.delete_applied() == 3
        after = (await client.info("commandstats"))["cmdstat_xdel"]["calls"]
        assert after - before == 1
        assert await client.xlen(stream) == 0
        left = 0 if acknowledge else 3  # 7.0.4 and later: the next claim drops them
        assert (await client.xpending(stream, keys.coordinator_group))["pending"] == left
        assert await store.delete_applied() == 0  # nothing waits

    _scenario(redis_url, body)


def test_a_failed_deletion_keeps_the_applied_observations_for_the_next(
    redis_url: str, redis_client: Any
) -> None:
    """Redis refusing the deletion raises and keeps the observations applied, deleted by the
    next call."""

    async def body(client: Redis, store: TaskStore) -> None:
        stream = keys.observations_stream(0)
        await _observed(client, store, "t1")
        pipeline = store.redis.pipeline

        class Refusing:
            def __init__(self, pipe: Any) -> None:
                self.pipe = pipe

            def __getattr__(self, name: str) -> Any:
                return getattr(self.pipe, name)

            async def execute(self) -> None:
                raise ConnectionError("refused")

        store.redis.pipeline = lambda **kw: Refusing(pipeline(**kw))  # type: ignore[method-assign]
        with pytest.raises(ConnectionError):
            await store.delete_applied()
        store.redis.pipeline = pipeline  # type: ignore[method-assign]
        assert await client.xlen(stream) == 1
        assert await store.delete_applied() == 1
        assert await client.xlen(stream) == 0

    _scenario(redis_url, body)


@pytest.mark.parametrize("acknowledge", [True, False])
def test_an_observation_committed_with_delete_now_is_deleted_by_its_commit(
    redis_url: str, redis_client: Any, acknowledge: bool
) -> None:
    """``delete_now`` (an outage report, which a second application would count again): the
    commit's script deletes the observation (acknowledged too when ``acknowledge_deleted``),
    and ``delete_applied`` has nothing of it to delete; the others still wait for it."""

    async def body(client: Redis, store: TaskStore) -> None:
        stream = keys.observations_stream(0)
        store.acknowledge_deleted = acknowledge
        now_id = await _observed(client, store, "t1", delete_now=True)
        assert await client.xrange(stream) == []  # deleted by its commit
        assert store.applied_due_in(3600) is None  # nothing waits
        left = 0 if acknowledge else 1  # 7.0.4 and later: the next claim drops it
        assert (await client.xpending(stream, keys.coordinator_group))["pending"] == left
        later_id = await _observed(client, store, "t2")
        assert [i.decode() for i, _f in await client.xrange(stream)] == [later_id]
        assert store.applied_due_in(3600) is not None
        assert await store.delete_applied() == 1
        assert await client.xlen(stream) == 0
        assert now_id != later_id

    _scenario(redis_url, body)
