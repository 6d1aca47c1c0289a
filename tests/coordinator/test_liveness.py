"""Deadlines that measure work, not queueing: the verdict on a late dispatch."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping, Sequence

import fakeredis
import pytest

from coordinator.liveness import Liveness, LivenessSettings, StreamProgress, Verdict
from coordinator.queues import QueueGauge
from shared import keys
from tests.redis_server import RedisClientFactory

SETTINGS = LivenessSettings(heartbeat_timeout_s=30.0, start_to_close_s=900.0)
NOW = 10_000.0


def _liveness(score: float | None, depth: int = 0, drain: float = 0.0) -> Liveness:
    return Liveness(
        scores={"d": score}, queue="orga.reasoning", queue_depth=depth, drain_per_s=drain
    )


def _judge(liveness: Liveness, looks: int = 0, dispatched_at: float = NOW - 40):
    return liveness.judge(["d"], NOW, dispatched_at, looks, SETTINGS)


def test_a_fresh_heartbeat_moves_the_deadline_one_timeout_past_the_beat() -> None:
    """A running call is never re-sent while its worker beats."""
    judgement = _judge(_liveness(NOW - 4))
    assert judgement.verdict is Verdict.RUNNING
    assert judgement.look_again_at == NOW - 4 + 30


def test_a_stale_heartbeat_means_the_worker_is_gone() -> None:
    """Beats that stopped a timeout ago: lost, re-sent now."""
    judgement = _judge(_liveness(NOW - 31))
    assert judgement.verdict is Verdict.LOST
    assert judgement.look_again_at is None
    assert "stopped heartbeating" in judgement.reason


def test_a_call_running_past_start_to_close_is_lost() -> None:
    """Start-to-close bounds a call that beats forever."""
    judgement = _judge(_liveness(NOW - 1), dispatched_at=NOW - 901)
    assert judgement.verdict is Verdict.LOST
    assert "ORGA_START_TO_CLOSE_S" in judgement.reason


def test_an_answered_dispatch_waits_for_its_observation() -> None:
    """Answered (negative score) recently: the observation is in the stream; wait."""
    assert _judge(_liveness(-(NOW - 2))).verdict is Verdict.ANSWERED
    assert _judge(_liveness(-(NOW - 61))).verdict is Verdict.LOST


def test_an_answered_dispatch_waits_while_its_observation_may_be_unapplied() -> None:
    """Answered 300 s ago: not re-sent while the coordinators have not read that far, or
    still have an entry that old pending; lost once they have read past it, or past
    start-to-close whatever they say."""

    def judged(progress: StreamProgress, age: float = 300) -> Verdict:
        live = Liveness(
            scores={"d": -(NOW - age)}, queue="orga.reasoning", queue_depth=0, drain_per_s=0.0,
            observations=progress,
        )  # fmt: skip
        return _judge(live).verdict

    answered_ms = int((NOW - 300) * 1000)
    assert judged(StreamProgress(delivered_ms=answered_ms - 60_000)) is Verdict.ANSWERED
    behind = StreamProgress(delivered_ms=answered_ms + 60_000, oldest_pending_ms=answered_ms)
    assert judged(behind) is Verdict.ANSWERED
    applied = StreamProgress(delivered_ms=answered_ms + 60_000, oldest_pending_ms=None)
    assert judged(applied) is Verdict.LOST
    stuck = StreamProgress(delivered_ms=answered_ms + 60_000, oldest_pending_ms=answered_ms - 1)
    assert judged(stuck, age=901) is Verdict.LOST


def test_an_answered_reasoning_waits_while_the_call_it_chained_may_be_queued() -> None:
    """A reasoning that chained its one call is answered by the tool worker running it
    (issue 25's chaos loss: judged "answered and never applied" behind a long tools queue,
    re-sent four times, failed). Read past and nothing pending: while the tools queue holds
    messages it is queued (draining) or has no consumer (not draining), never lost; with the
    tools queue empty it gets one look more, then is lost as before (and past start-to-close
    at once)."""
    answered_ms = int((NOW - 300) * 1000)
    applied = StreamProgress(delivered_ms=answered_ms + 60_000, oldest_pending_ms=None)

    def judged(depth: int, drain: float, age: float = 300, looks: int = 0, chains: bool = True):
        live = Liveness(
            scores={"d": -(NOW - age)}, queue="orga.reasoning", queue_depth=0, drain_per_s=0.0,
            observations=applied, chains=chains, chained_depth=depth, chained_drain_per_s=drain,
        )  # fmt: skip
        return _judge(live, looks=looks)

    queued = judged(1000, 10.0)
    assert queued.verdict is Verdict.QUEUED and queued.look_again_at == NOW + 200
    assert "queued behind 1000 messages on orga.tools" in queued.reason
    assert "chained" in queued.reason
    idle = judged(5, 0.0)
    assert idle.verdict is Verdict.NO_CONSUMER and idle.look_again_at == NOW + 30
    assert "orga worker --role tools" in idle.reason
    # the tools queue empty: one look more (the call taken, not started yet), then lost
    grace = judged(0, 10.0)
    assert grace.verdict is Verdict.UNSTARTED and grace.look_again_at == NOW + 30
    assert judged(0, 10.0, looks=1).verdict is Verdict.LOST
    assert judged(1000, 10.0, age=901).verdict is Verdict.LOST
    # a dispatch that chains nothing is not held by the tools queue
    assert judged(1000, 10.0, chains=False).verdict is Verdict.LOST


def test_a_reasoning_whose_chained_call_runs_is_not_lost_to_the_reasonings_start() -> None:
    """A reasoning that chained its one call may wait up to start-to-close for the call to
    leave the tools queue (above); once the call runs, its tool worker beats the reasoning's
    fence. Judged from the reasoning's dispatch alone, a call started 950 s after it was
    "still running after 950s" and the reasoning was re-sent while its call ran. Each leg
    (the model call, the wait in the tools queue, the call) has start-to-close: a chaining
    reasoning running is lost past three of them, one that chains nothing past one."""

    def judged(running_for: float, chains: bool = True) -> Verdict:
        live = Liveness(
            scores={"d": NOW - 5}, queue="orga.reasoning", queue_depth=0, drain_per_s=0.0,
            chains=chains,
        )  # fmt: skip
        return _judge(live, dispatched_at=NOW - running_for).verdict

    assert judged(950) is Verdict.RUNNING
    assert judged(2699) is Verdict.RUNNING
    assert judged(2701) is Verdict.LOST
    assert judged(950, chains=False) is Verdict.LOST
    assert judged(899, chains=False) is Verdict.RUNNING


def _marked(*marks: tuple[str, float]) -> dict[str, float | None]:
    """The answer marks of dispatch ``d``: (how, when answered)."""
    return {keys.answered_via_member("d", via): -at for via, at in marks}


def test_a_reasoning_whose_answer_went_out_directly_keeps_the_answered_rule() -> None:
    """Every act iteration "may chain" its one call; the worker's answer mark says whether it
    did. An answer marked as published on the observations stream is judged as any other
    answer, read past and not applied: lost two timeouts after it, not held while the tools
    queue holds messages (nor a no-consumer warning for that queue); one marked as gone out
    inside its chained call waits for the tools queue; no mark (a worker older than the
    marks) may have chained, as before. The latest mark counts (the tool worker that ran the
    chained call marks the same fence answered directly)."""
    answered_at = NOW - 300
    applied = StreamProgress(delivered_ms=int(answered_at * 1000) + 60_000, oldest_pending_ms=None)

    def judged(marks: dict[str, float | None], depth: int = 1000, drain: float = 10.0,
               age: float = 300):  # fmt: skip
        live = Liveness(
            scores={"d": -(NOW - age)}, queue="orga.reasoning", queue_depth=0, drain_per_s=0.0,
            observations=applied, chains=True, chained_depth=depth, chained_drain_per_s=drain,
            marks=marks,
        )  # fmt: skip
        return _judge(live)

    direct = _marked((keys.ANSWERED_DIRECT, answered_at))
    lost = judged(direct)
    assert lost.verdict is Verdict.LOST and lost.look_again_at is None
    assert "answered 300s ago and never applied" in lost.reason
    assert judged(direct, depth=5, drain=0.0).verdict is Verdict.LOST  # no no_consumer
    assert judged(direct, depth=0).verdict is Verdict.LOST  # no grace look either
    assert judged(_marked((keys.ANSWERED_DIRECT, NOW - 40)), age=40).verdict is Verdict.ANSWERED
    chained = _marked((keys.ANSWERED_CHAINED, answered_at))
    assert judged(chained).verdict is Verdict.QUEUED
    assert judged(chained, depth=5, drain=0.0).verdict is Verdict.NO_CONSUMER
    assert judged({}).verdict is Verdict.QUEUED  # no mark: may have chained
    assert judged(_marked((keys.ANSWERED_CHAINED, answered_at))
                  | {keys.answered_via_member("d", keys.ANSWERED_DIRECT): None}
                  ).verdict is Verdict.QUEUED  # fmt: skip
    # the chained call's tool worker answered later, on the stream: the answered rule
    both = _marked((keys.ANSWERED_CHAINED, answered_at - 100), (keys.ANSWERED_DIRECT, answered_at))
    assert judged(both).verdict is Verdict.LOST
    reversed_ = _marked(
        (keys.ANSWERED_DIRECT, answered_at - 100), (keys.ANSWERED_CHAINED, answered_at)
    )
    assert judged(reversed_).verdict is Verdict.QUEUED


def test_only_a_reasoning_marked_chained_or_unmarked_runs_in_three_legs() -> None:
    """A running reasoning whose answer is marked chained (its call's tool worker beats its
    fence) or not marked yet (its model call, or a worker older than the marks) has three
    start-to-close periods; one marked answered on the stream has one."""

    def judged(marks: dict[str, float | None]) -> Verdict:
        live = Liveness(
            scores={"d": NOW - 5}, queue="orga.reasoning", queue_depth=0, drain_per_s=0.0,
            chains=True, marks=marks,
        )  # fmt: skip
        return _judge(live, dispatched_at=NOW - 950).verdict

    assert judged(_marked((keys.ANSWERED_CHAINED, NOW - 100))) is Verdict.RUNNING
    assert judged({}) is Verdict.RUNNING
    assert judged(_marked((keys.ANSWERED_DIRECT, NOW - 100))) is Verdict.LOST


def test_a_queued_dispatch_waits_as_long_as_its_queue_takes_to_drain() -> None:
    """Not started, 1000 messages ahead draining 10/s: look again in 200 s, not re-send."""
    judgement = _judge(_liveness(None, depth=1000, drain=10.0))
    assert judgement.verdict is Verdict.QUEUED
    assert judgement.look_again_at == NOW + 200
    assert "queued behind 1000" in judgement.reason


def test_the_queued_wait_grows_with_the_queue_up_to_a_cap() -> None:
    """A deeper queue means a later look, capped at ten minutes."""
    short = _judge(_liveness(None, depth=100, drain=1.0)).look_again_at
    long = _judge(_liveness(None, depth=200, drain=1.0)).look_again_at
    huge = _judge(_liveness(None, depth=10**6, drain=1.0)).look_again_at
    assert short is not None and long is not None and huge is not None
    assert short < long <= huge == NOW + 600


def test_a_queue_that_does_not_drain_has_no_consumer() -> None:
    """Messages waiting and none started: not re-sent (it would only queue again); said."""
    judgement = _judge(_liveness(None, depth=5, drain=0.0))
    assert judgement.verdict is Verdict.NO_CONSUMER
    assert "orga worker --role" in judgement.reason


def test_never_started_with_an_empty_queue_is_lost_on_the_second_look() -> None:
    """One grace look (a message between the queue and the start), then lost."""
    first = _judge(_liveness(None), looks=0)
    assert first.verdict is Verdict.UNSTARTED and first.look_again_at == NOW + 30
    assert _judge(_liveness(None), looks=1).verdict is Verdict.LOST


def test_the_queue_gauge_measures_depth_and_drain_rate() -> None:
    """Two samples a second apart: the depth, and starts per second from the counters."""
    redis = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    gauge = QueueGauge()

    async def run() -> None:
        await redis.set(keys.queue_started_key(keys.reasoning_queue), 100)
        await redis.rpush(keys.reasoning_queue, *[b"m"] * 7)
        await gauge.sample(redis, now=1.0)
        await redis.set(keys.queue_started_key(keys.reasoning_queue), 150)
        await gauge.sample(redis, now=3.0)

    asyncio.run(run())
    assert gauge.depth(keys.reasoning_queue) == 7
    assert gauge.drain_per_s(keys.reasoning_queue) == pytest.approx(25.0)
    assert gauge.drain_per_s(keys.tools_queue) == 0.0


def test_the_queue_gauge_reads_the_start_counters_once_per_window() -> None:
    """Workers add their starts once per beat (5 s): with a 10 s window, samples a second
    apart read the counters only every 10 s, so a beat's starts are never one sample's burst
    and the next samples' zero; the depth is read every second."""
    redis = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    gauge = QueueGauge(rate_window_s=10.0)
    started = keys.queue_started_key(keys.reasoning_queue)
    rates: list[float] = []

    async def run() -> None:
        await redis.set(started, 0)
        await gauge.sample(redis, now=1.0)
        for second in range(2, 22):
            if second % 5 == 0:  # one beat adds the 5 s of starts at 4 per second
                await redis.incrby(started, 20)
            await redis.rpush(keys.reasoning_queue, b"m")
            await gauge.sample(redis, now=float(second))
            rates.append(gauge.drain_per_s(keys.reasoning_queue))

    asyncio.run(run())
    assert gauge.depth(keys.reasoning_queue) == 20
    assert rates[:9] == [0.0] * 9  # 2 .. 10 s: no reading yet past the first
    assert rates[9] == pytest.approx(4.0)  # at 11 s: 40 starts in 10 s
    assert rates[10:19] == [pytest.approx(4.0)] * 9
    assert rates[19] == pytest.approx(4.0)  # at 21 s: 40 more in 10 s


def test_the_queue_gauge_reads_how_far_the_coordinators_got(
    redis_client: RedisClientFactory,
) -> None:
    """The group's newest delivered id and oldest pending id, as stream milliseconds."""

    async def run() -> list[StreamProgress]:
        seen = []
        async with redis_client() as redis:
            stream, group = keys.observations_stream(0), keys.coordinator_group
            gauge = QueueGauge()
            await gauge.sample(redis, now=1.0)
            seen.append(gauge.observations)
            await redis.xgroup_create(stream, group, id="0", mkstream=True)
            ids = [await redis.xadd(stream, {"n": n}, id=f"{1000 + n}-0") for n in range(3)]
            await gauge.sample(redis, now=3.0)
            seen.append(gauge.observations)
            await redis.xreadgroup(group, "c1", {stream: ">"}, count=3)
            await gauge.sample(redis, now=5.0)
            seen.append(gauge.observations)
            await redis.xack(stream, group, *ids)
            await gauge.sample(redis, now=7.0)
            seen.append(gauge.observations)
        return seen

    unknown, unread, pending, applied = asyncio.run(run())
    assert unknown == StreamProgress()
    assert unread == StreamProgress(delivered_ms=0, oldest_pending_ms=None)
    assert pending == StreamProgress(delivered_ms=1002, oldest_pending_ms=1000)
    assert applied == StreamProgress(delivered_ms=1002, oldest_pending_ms=None)


def test_the_queue_gauge_reads_each_partitions_observations_apart(
    redis_client: RedisClientFactory,
) -> None:
    """A task's dispatch is judged on its own partition's observations stream: entries
    pending on partition 1 say nothing of partition 0."""

    async def run() -> tuple[StreamProgress, StreamProgress]:
        async with redis_client() as redis:
            group = keys.coordinator_group
            for p in range(2):
                stream = keys.observations_stream(p)
                await redis.xgroup_create(stream, group, id="0", mkstream=True)
            busy = keys.observations_stream(1)
            await redis.xadd(busy, {"n": 1}, id="2000-0")
            await redis.xreadgroup(group, "c1", {busy: ">"}, count=1)
            gauge = QueueGauge(partitions=2)
            await gauge.sample(redis, now=1.0)
            return gauge.progress(0), gauge.progress(1)

    quiet, busy = asyncio.run(run())
    assert quiet == StreamProgress(delivered_ms=0, oldest_pending_ms=None)
    assert busy == StreamProgress(delivered_ms=2000, oldest_pending_ms=2000)


class _Broker:
    """A broker that tells its queues' depths (or fails, or defers to the Redis lists)."""

    def __init__(self) -> None:
        self.depths: dict[str, int] | None = {keys.reasoning_queue: 12, keys.tools_queue: 3}
        self.down = False

    def queue_depths(self, queues: Sequence[str]) -> Mapping[str, int] | None:
        if self.down:
            raise ConnectionError("broker unreachable")
        return None if self.depths is None else {q: self.depths[q] for q in queues}


class _HungBroker(_Broker):
    """A broker whose socket hangs until released."""

    def __init__(self) -> None:
        super().__init__()
        self.hung = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def queue_depths(self, queues: Sequence[str]) -> Mapping[str, int] | None:
        self.calls += 1
        if self.hung.is_set():
            self.release.wait(30)
        return super().queue_depths(queues)


def test_a_hung_broker_does_not_stall_the_queue_gauge() -> None:
    """A broker that never answers: a sample returns after the gauge's timeout with the last
    depths read, the hung call is not asked again while it hangs, and its answer counts once it
    comes."""
    redis = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    broker = _HungBroker()
    gauge = QueueGauge(broker=broker, broker_timeout_s=0.2)
    took: list[float] = []

    async def run() -> None:
        await gauge.sample(redis, now=1.0)
        broker.hung.set()
        broker.depths = {keys.reasoning_queue: 40, keys.tools_queue: 7}
        for now in (3.0, 5.0):
            started = time.monotonic()
            await gauge.sample(redis, now=now)
            took.append(time.monotonic() - started)
            assert gauge.depth(keys.reasoning_queue) == 12  # the last depths read
        assert broker.calls == 2  # the hung call awaited again, not a second thread
        broker.release.set()
        await gauge.sample(redis, now=7.0)
        assert gauge.depth(keys.reasoning_queue) == 40

    try:
        asyncio.run(run())
    finally:
        broker.release.set()
    assert max(took) < 2.0


def test_the_queue_gauge_asks_a_broker_of_its_own_for_the_depths() -> None:
    """With a broker that tells its depths (RabbitMQ), those are the depths, not the empty
    lists on the state Redis; a broker that does not answer leaves the last depths; one that
    answers None leaves the Redis lists in charge."""
    redis = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    broker = _Broker()
    gauge = QueueGauge(broker=broker)
    seen: list[tuple[int, int]] = []

    async def run() -> None:
        await redis.rpush(keys.reasoning_queue, b"m")
        for now, change in ((1.0, None), (3.0, "down"), (5.0, "redis")):
            if change == "down":
                broker.down = True
            elif change == "redis":
                broker.down, broker.depths = False, None
            await gauge.sample(redis, now=now)
            seen.append((gauge.depth(keys.reasoning_queue), gauge.depth(keys.tools_queue)))

    asyncio.run(run())
    assert seen == [(12, 3), (12, 3), (1, 0)]
