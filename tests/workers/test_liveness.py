"""Workers say which dispatches they run, keep them alive, and mark them answered."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from shared import keys
from shared.protocol import Fence
from shared.settings import OrgaSettings
from tests.redis_server import RedisClientFactory
from workers.liveness import MARK_DELAY_S, Liveness
from workers.providers.settings import ProviderSettings
from workers.runtime import ProcessServices

FENCE = Fence(task_id="t1", step_id="s", iteration=2, attempt=3, nonce="abc")


def test_a_started_dispatch_is_scored_counted_beaten_and_answered(
    redis_client: RedisClientFactory,
) -> None:
    """Start: a positive score and a start count; beats refresh it; answered: negative."""
    # A real Redis: with a fake one this test hung now and then in the suite's order (the
    # client, built outside the test's loop, waiting on a reply forever).
    running: list[int] = []

    async def run() -> tuple[float, float, float, int]:
        async with redis_client() as redis:
            liveness = Liveness(redis, interval_s=0.05)
            await liveness.started([FENCE], keys.reasoning_queue)
            first = await redis.zscore(keys.heartbeats_key, FENCE.liveness_id())
            await asyncio.sleep(0.2)
            beaten = await redis.zscore(keys.heartbeats_key, FENCE.liveness_id())
            liveness.finished([FENCE])
            pipe = redis.pipeline(transaction=True)
            liveness.answered(pipe, [FENCE])
            await pipe.execute()
            answered = await redis.zscore(keys.heartbeats_key, FENCE.liveness_id())
            started = int(await redis.get(keys.queue_started_key(keys.reasoning_queue)))
            await liveness.close()
            running.append(liveness.running)
        assert first is not None and beaten is not None and answered is not None
        return first, beaten, answered, started

    first, beaten, answered, started = asyncio.run(run())
    assert first > 0 and beaten > first
    assert answered < 0
    assert started == 1
    assert running == [0]


def test_the_liveness_id_tells_redispatches_and_calls_apart() -> None:
    """A re-send (new nonce) and each call have their own id; a Celery redelivery shares it."""
    assert FENCE.liveness_id() == FENCE.model_copy().liveness_id()
    assert FENCE.liveness_id() != FENCE.model_copy(update={"nonce": "def"}).liveness_id()
    assert FENCE.for_call("c1").liveness_id() != FENCE.for_call("c2").liveness_id()


def test_one_process_runs_the_coroutines_of_many_pool_threads_at_once() -> None:
    """Fifty pool threads hand their coroutines to the one loop: all fifty wait together."""
    services = ProcessServices(
        OrgaSettings(redis_url="redis://127.0.0.1:1/0"), ProviderSettings(), "redis://127.0.0.1:1/0"
    )
    in_flight = 0
    peak = 0
    gate = asyncio.Event()

    async def call() -> str:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        if peak == 50:
            gate.set()
        await asyncio.wait_for(gate.wait(), 10)
        in_flight -= 1
        return threading.current_thread().name

    results: list[str] = []
    threads = [
        threading.Thread(target=lambda: results.append(services.run(call()))) for _ in range(50)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=20)
    finally:
        services.close()
    assert peak == 50
    assert results == ["orga-loop"] * 50


def test_a_start_brings_a_far_look_at_its_task_to_one_timeout(
    redis_url: str, redis_client: object
) -> None:
    """A queued dispatch's task, due in 10 minutes, is due one heartbeat timeout after the
    start; a sooner look is kept, and a task no longer due is not added."""
    from redis.asyncio import Redis

    async def run() -> dict[str, float | None]:
        redis = Redis.from_url(redis_url)
        liveness = Liveness(redis, interval_s=5.0, timeout_s=30.0)
        now = time.time()
        await redis.zadd(keys.deadlines_key(0), {"far": now + 600, "soon": now + 5})
        fences = [FENCE.model_copy(update={"task_id": t}) for t in ("far", "soon", "ended")]
        for fence in fences:
            await liveness.started([fence], keys.reasoning_queue)
        scores = {t: await redis.zscore(keys.deadlines_key(0), t) for t in ("far", "soon", "ended")}
        await liveness.close()
        await redis.aclose()
        return {t: (s - now if s is not None else None) for t, s in scores.items()}

    due = asyncio.run(run())
    assert due["far"] is not None and 29 < due["far"] < 35
    assert due["soon"] is not None and due["soon"] < 6
    assert due["ended"] is None


def test_starts_are_counted_by_the_beat_in_one_incrby_per_queue(
    redis_client: RedisClientFactory,
) -> None:
    """Ten starts send no INCR: the next beat adds them at once (one INCRBY per queue), and
    close adds the starts no beat added yet."""

    async def run() -> tuple[object, object, object, object]:
        async with redis_client() as redis:
            counter = keys.queue_started_key(keys.reasoning_queue)
            tools = keys.queue_started_key(keys.tools_queue)
            liveness = Liveness(redis, interval_s=0.2)
            fences = [FENCE.model_copy(update={"nonce": f"n{i}"}) for i in range(10)]
            for fence in fences:
                await liveness.started([fence], keys.reasoning_queue)
            before = await redis.get(counter)
            await asyncio.sleep(0.35)  # one beat
            after_beat = await redis.get(counter)
            liveness.finished(fences)
            await liveness.started([FENCE.for_call("c1")], keys.tools_queue)
            await liveness.close()  # before the next beat
            return before, after_beat, await redis.get(counter), await redis.get(tools)

    before, after_beat, after_close, tools = asyncio.run(run())
    assert before is None
    assert after_beat == b"10"
    assert after_close == b"10"
    assert tools == b"1"


def test_a_start_before_its_near_look_leaves_the_task_look_alone(redis_url: str) -> None:
    """A dispatch whose look, as the coordinator set it, is still ahead and within one
    timeout: the start is its heartbeat alone; a look passed (the coordinator may have moved
    it), beyond one timeout, or not said: the start brings the task's look to one timeout."""
    from redis.asyncio import Redis

    async def run() -> tuple[dict[str, int], dict[str, float | None]]:
        redis = Redis.from_url(redis_url)
        liveness = Liveness(redis, interval_s=5.0, timeout_s=30.0)
        now = time.time()
        looks = {"near": now + 25, "passed": now - 1, "beyond": now + 120, "unsaid": None}
        await redis.zadd(keys.deadlines_key(0), dict.fromkeys(looks, now + 600))
        sent: dict[str, int] = {}
        for task_id, look_at in looks.items():
            pipe = redis.pipeline(transaction=False)
            fence = FENCE.model_copy(update={"task_id": task_id})
            write = liveness.start(pipe, [fence], keys.reasoning_queue, look_at)
            sent[task_id] = write.sent
            assert len(pipe.command_stack) == sent[task_id]
            liveness.check_start(await pipe.execute(raise_on_error=False), write)
        scores = {t: await redis.zscore(keys.deadlines_key(0), t) for t in looks}
        await liveness.close()
        await redis.aclose()
        return sent, {t: (s - now if s is not None else None) for t, s in scores.items()}

    sent, due = asyncio.run(run())
    assert sent == {"near": 1, "passed": 2, "beyond": 2, "unsaid": 2}
    assert due["near"] == 600  # untouched (the coordinator's own look is near in truth)
    for task_id in ("passed", "beyond", "unsaid"):
        look = due[task_id]
        assert look is not None and 29 < look < 35


def test_a_direct_answers_mark_goes_with_the_next_heartbeat_write(redis_url: str) -> None:
    """A direct answer's mark is not a command of its own: the next start's ``ZADD`` carries
    it, or a beat's; with neither, it is written alone within MARK_DELAY_S; close writes what
    waits."""
    from redis.asyncio import Redis

    def fence(nonce: str) -> Fence:
        return FENCE.model_copy(update={"nonce": nonce})

    async def zadds(redis: Redis) -> int:
        stats = await redis.info("commandstats")
        return int(stats.get("cmdstat_zadd", {}).get("calls", 0))

    async def score(redis: Redis, nonce: str) -> float | None:
        return await redis.zscore(keys.heartbeats_key, fence(nonce).liveness_id())

    async def run() -> None:
        redis = Redis.from_url(redis_url)
        liveness = Liveness(redis, interval_s=0.05, timeout_s=30.0)
        liveness.answered_later([fence("a")])
        assert await score(redis, "a") is None
        await redis.config_resetstat()
        await liveness.started([fence("b")], keys.reasoning_queue, look_at=time.time() + 20)
        assert await zadds(redis) == 1, "the start's ZADD carried the mark"
        assert (await score(redis, "a") or 0) < 0 < (await score(redis, "b") or 0)
        direct = keys.answered_via_member(fence("a").liveness_id(), keys.ANSWERED_DIRECT)
        assert (await redis.zscore(keys.heartbeats_key, direct) or 0) < 0

        liveness.answered_later([fence("c")])  # "b" runs: the next beat carries it
        await asyncio.sleep(0.25)
        assert (await score(redis, "c") or 0) < 0 < (await score(redis, "b") or 0)
        liveness.finished([fence("b")])

        liveness.answered_later([fence("d")])  # nothing runs: a ZADD of its own
        await asyncio.sleep(MARK_DELAY_S + 0.3)
        assert (await score(redis, "d") or 0) < 0

        liveness.answered_later([fence("e")])
        await liveness.close()
        assert (await score(redis, "e") or 0) < 0
        await redis.aclose()

    asyncio.run(run())


def test_a_start_that_fails_gives_the_marks_it_carried_back(redis_url: str) -> None:
    """The marks a start's ZADD carried are written later when its pipeline fails or is not
    sent, and when one of its replies is an error (raised, as before)."""
    from redis.asyncio import Redis
    from redis.exceptions import ResponseError

    async def run() -> tuple[float | None, float | None]:
        redis = Redis.from_url(redis_url)
        liveness = Liveness(redis, interval_s=5.0)
        first, second = FENCE.model_copy(update={"nonce": "x"}), FENCE.for_call("c1")
        liveness.answered_later([first])
        write = liveness.start(redis.pipeline(transaction=False), [FENCE], keys.reasoning_queue)
        assert first.liveness_id() in write.marks
        liveness.give_back(write)  # its pipeline never went out
        liveness.finished([FENCE])
        liveness.answered_later([second])
        refused = liveness.start(redis.pipeline(transaction=False), [FENCE], keys.tools_queue)
        assert set(refused.marks) >= {first.liveness_id(), second.liveness_id()}
        with pytest.raises(ResponseError):
            liveness.check_start([ResponseError("refused"), 1], refused)
        liveness.finished([FENCE])
        await asyncio.sleep(MARK_DELAY_S + 0.3)
        scores = (
            await redis.zscore(keys.heartbeats_key, first.liveness_id()),
            await redis.zscore(keys.heartbeats_key, second.liveness_id()),
        )
        await liveness.close()
        await redis.aclose()
        return scores

    first, second = asyncio.run(run())
    assert first is not None and first < 0
    assert second is not None and second < 0


def test_a_beating_liveness_closes_on_a_client_with_a_socket_timeout(redis_url: str) -> None:
    """The runtime's clients have a ``socket_timeout``, so each command runs in Python 3.11's
    ``asyncio.wait_for``, which drops a cancel that arrives as the command completes: a close
    while the beat's pipeline runs must still end the beat (40 closes at random moments)."""
    import random

    from redis.asyncio import Redis

    rng = random.Random(11)

    async def run() -> int:
        closed = 0
        redis = Redis.from_url(redis_url, socket_timeout=5)
        try:
            for _ in range(40):
                liveness = Liveness(redis, interval_s=0.001)
                await liveness.started([FENCE], keys.reasoning_queue)
                await asyncio.sleep(rng.random() * 0.01)
                await asyncio.wait_for(liveness.close(), 5)
                closed += 1
        finally:
            await redis.aclose()
        return closed

    assert asyncio.run(run()) == 40
