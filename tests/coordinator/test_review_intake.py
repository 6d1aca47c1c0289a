"""Review of the intake's pipelined creates (branch ``intake``): guarantees a create sent alone
kept on ``main`` that a chunk of creates must keep too.

Each test injects its fault below the coordinator (a Redis reply, a failing bookkeeping step),
so the same test runs on ``main`` (creates sent one by one) and on the chunked intake.
"""

from __future__ import annotations

import asyncio
import contextlib

from redis.exceptions import OutOfMemoryError

from coordinator.store import PendingCommit
from shared import keys
from tests.coordinator.intake_harness import TASK
from tests.coordinator.intake_harness import coordinator as _coordinator
from tests.coordinator.intake_harness import deliveries as _deliveries
from tests.coordinator.intake_harness import refuse_once as _refuse_once
from tests.coordinator.intake_harness import running as _running
from tests.coordinator.intake_harness import submit as _submit
from tests.redis_server import RedisClientFactory


def test_an_idempotency_key_stays_with_the_first_submission_when_its_create_is_refused(
    redis_client: RedisClientFactory,
) -> None:
    """``a`` then ``b``, both with key ``k``, in one read; Redis refuses ``a``'s create once
    (OOM, transient). Sent alone (main), ``b`` is not handled before ``a`` is retried: ``a``
    owns ``k``, ``b`` is its duplicate, as with no fault. Chunked, ``b``'s script runs after
    the refused one in the same pipeline: ``b`` is created owning ``k`` and the retried ``a``
    becomes an alias of ``b`` - the submission order the keys promise is inverted."""

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            refused = _refuse_once(client, keys.task_key("a", 0))
            await _submit(client, "a", {**TASK, "idempotency_key": "k"})
            await _submit(client, "b", {**TASK, "idempotency_key": "k"})
            with contextlib.suppress(OutOfMemoryError):
                await coordinator._intake_once()
            assert refused
            for _ in range(5):  # claimable again after transient_backoff_ms
                if not await _deliveries(client):
                    break
                await asyncio.sleep(0.12)
                await coordinator._tick_once()
            assert await _deliveries(client) == {}
            assert await _running(client, "a"), await client.hgetall(keys.task_key("a", 0))
            assert await client.hgetall(keys.task_key("b", 0)) == {"alias_of": "a"}

    asyncio.run(run())


def test_an_unexpected_error_after_one_create_dead_letters_that_entry_alone(
    redis_client: RedisClientFactory,
) -> None:
    """Ten entries in one read; the bookkeeping after ``t03``'s create raises (a bug, a metrics
    exporter failing). Main: ``t03`` is dead-lettered alone, every other task is created,
    leased and its entry acknowledged (``_guarded``). Chunked: the error escapes the chunk's
    send outside any entry's guard: nothing is dead-lettered, ``t04``-``t07`` are created but
    never counted as held, and ``t08``, ``t09`` are left pending unhandled."""

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            committed = coordinator._committed

            def failing(pending: PendingCommit) -> None:
                if pending.record.task_id == "t03":
                    raise ValueError("bookkeeping failed for t03")
                committed(pending)

            coordinator._committed = failing  # type: ignore[method-assign]
            ids = [f"t{n:02d}" for n in range(10)]
            for task_id in ids:
                await _submit(client, task_id)
            raised: BaseException | None = None
            try:
                await coordinator._intake_once()
            except ValueError as exc:
                raised = exc
            for task_id in ids:
                assert await _running(client, task_id), task_id
            assert coordinator._held >= set(ids) - {"t03"}
            dead = [f for _i, f in await client.xrange(keys.dead_letter_stream(0))]
            assert [d["raw_task_id"] for d in dead] == ["t03"]
            assert await _deliveries(client) == {}
            assert raised is None

    asyncio.run(run())


def test_an_idempotency_key_stays_with_the_first_submission_when_its_lease_is_held(
    redis_client: RedisClientFactory,
) -> None:
    """``a`` then ``b``, both with key ``k``, in one read, ``a``'s lease held by another
    coordinator (a purged task's lease still live, a peer's claim). Main: ``a`` is created
    apart before ``b`` is handled, ``a`` owns ``k`` and ``b`` is its duplicate. Chunked: ``a``'s
    script writes nothing (lease held), ``b``'s script after it in the pipeline takes ``k``,
    and ``a``, created apart only when the chunk is answered, becomes an alias of ``b``."""

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            await client.set(keys.lease_key("a", 0), "other", px=60_000)
            await _submit(client, "a", {**TASK, "idempotency_key": "k"})
            await _submit(client, "b", {**TASK, "idempotency_key": "k"})
            await coordinator._intake_once()
            assert await _deliveries(client) == {}
            assert await client.hget(keys.task_key("a", 0), "alias_of") is None
            assert await client.hgetall(keys.task_key("b", 0)) == {"alias_of": "a"}

    asyncio.run(run())
