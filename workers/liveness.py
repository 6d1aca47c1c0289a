"""Liveness of the dispatches a worker process runs: started, heartbeating, answered.

Temporal's activity timeouts are the model. A worker that starts a dispatch says so at once
(``orga:heartbeats``: the dispatch's liveness id scored with the time; the starts asked for in
one turn of the event loop share one ``ZADD``, issue 27, sent at that turn's end or earlier,
once the batch holds :data:`~workers.redis_batch.MAX_BATCH_COMMANDS` commands, and split where
a caller of the batch writes the key itself; each dispatch runs only once its start is
written, or refused by a Redis that takes no writes, out of memory or a read-only replica,
which is logged and the dispatch runs anyway: :meth:`Liveness.starting`), refreshes the score of
every call it runs every ``heartbeat_interval_s`` from one task on its event loop, and marks
the dispatch answered (minus the time) once it published its answer, with a mark of how the
answer went out (on the observations stream, or inside the one call a reasoning chained:
:func:`shared.keys.answered_via_member`). A direct answer's marks (its observation is in the
stream) wait for the next ``ZADD`` of ``orga:heartbeats`` this process sends anyway, the start
of another dispatch or a beat, or go in a ``ZADD`` of their own :data:`MARK_DELAY_S` after the
answer (issue 27: about one command less per model call;
:meth:`Liveness.answered_later`); a chained answer's mark goes with its write, in its
transaction or right after it in its pipeline (:meth:`Liveness.answered`,
``ProcessServices.publish``).
The coordinator reads those scores only when a dispatch's deadline passes: a fresh heartbeat
means the call is running (the deadline moves on), a stale one means its worker is gone (the
call is re-sent), no entry means it has not started (still queued, or lost before it started).
Each start also counts on ``orga:started:{queue}``, which tells the coordinator how fast a
queue drains: counted in the process and added by the next beat (one ``INCRBY`` per queue and
beat, not one ``INCR`` per start: issue 27), so the counter lags the starts by at most one
``heartbeat_interval_s``, and the coordinator measures the rate over at least two of them
(:class:`coordinator.queues.QueueGauge`). Starts not yet added when the process dies are not
counted: the rate is an estimate, and the next samples correct it.

The same beat reads which of the tasks it runs calls for have ended (``orga:tasks:finished``,
where the coordinator's commit puts a task that completed, failed or was aborted: cancelled by
an operator, or with its parent): the calls of those are cancelled (:meth:`Liveness.watching`),
and a command's launcher then kills every process the command started. So a cancelled task's
commands stop within one ``heartbeat_interval_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from shared import keys
from shared.aio import cancel_and_wait
from shared.protocol import Fence
from workers.broker import TRANSIENT_WRITE_ERRORS

__all__ = ["LOOK_SLACK_S", "MARK_DELAY_S", "Liveness", "StartWrite"]

log = logging.getLogger("orga.worker.liveness")

LOOK_SLACK_S = 5.0
"""How far before the look its coordinator set a dispatch must start for the start to leave
that look alone (:meth:`Liveness.start`): a worker's clock may be this far behind the
coordinator's, which may have looked, and moved the look, already."""

MARK_DELAY_S = 0.5
"""How long a direct answer's mark may wait for a ``ZADD`` of ``orga:heartbeats`` this process
sends anyway (a start's, a beat's) before it is written on its own. Until it is written the
dispatch's score is its last beat, at most ``heartbeat_interval_s`` + this old, which the
coordinator judges "running" (look again one timeout after that beat), never "lost"."""


@dataclass(frozen=True, slots=True)
class StartWrite:
    """What a start writes (:meth:`Liveness.starting`): how many of its pipeline's replies are
    the start's (:meth:`Liveness.check_start`), the answer marks its ``ZADD`` carries (given
    back to be written later if the pipeline fails), the members of that ``ZADD`` of
    ``orga:heartbeats`` (the marks and the start), and the task's look brought forward, if it
    must be (:meth:`pull`)."""

    sent: int
    marks: Mapping[str, float] = field(default_factory=dict)
    beats: Mapping[str, float] = field(default_factory=dict)
    due: tuple[str, Mapping[str, float]] | None = None
    """The deadline index and its members for ``ZADD ... XX LT`` (None: the look is near)."""

    def pull(self, pipe: Pipeline) -> None:
        """Bring the task's look forward in ``pipe`` (``ZADD ... XX LT`` of its deadline
        index), when the start must (:meth:`Liveness.starting`)."""
        if self.due is not None:
            pipe.zadd(self.due[0], dict(self.due[1]), xx=True, lt=True)


class Liveness:
    """The dispatches one worker process runs now, kept alive in Redis while they run.

    Every method runs on the process's event loop.
    """

    def __init__(
        self, redis: Redis, interval_s: float, timeout_s: float = 30.0, *, partitions: int = 1
    ) -> None:
        self._redis = redis
        self._partitions = partitions
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._running: Counter[str] = Counter()
        self._starts: Counter[str] = Counter()
        """Queue -> starts not yet added to ``orga:started:{queue}`` (the next beat adds them)."""
        self._watched: dict[str, set[asyncio.Future[Any]]] = {}
        self._beating: asyncio.Task[None] | None = None
        self._marks: dict[str, float] = {}
        """Answer marks not written yet (member -> negative score): the next ``ZADD`` of
        ``orga:heartbeats`` carries them (:meth:`answered_later`)."""
        self._flushing: asyncio.Task[None] | None = None

    @property
    def running(self) -> int:
        """How many dispatches (liveness ids) run in this process now."""
        return len(self._running)

    async def started(
        self, fences: Sequence[Fence], queue: str, look_at: float | None = None
    ) -> None:
        """Say that this process runs ``fences`` (one dispatch and what it answers for)."""
        pipe = self._redis.pipeline(transaction=False)
        write = self.start(pipe, fences, queue, look_at)
        try:
            replies = await pipe.execute(raise_on_error=False)
        except BaseException:
            self.give_back(write)
            raise
        self.check_start(replies, write)

    def start(
        self, pipe: Pipeline, fences: Sequence[Fence], queue: str, look_at: float | None = None
    ) -> StartWrite:
        """:meth:`started` in ``pipe`` (not a transaction), which may read more in the same
        round trip: its first replies, as many as ``sent`` says, go to :meth:`check_start`;
        a pipeline that raises gives the write back (:meth:`give_back`). The start's ``ZADD``
        carries the answer marks waiting to be written (:meth:`answered_later`).

        ``look_at``: when the coordinator looks at the dispatch first, as it set it at the
        dispatch (None: unknown)."""
        write = self.starting(fences, queue, look_at)
        pipe.zadd(keys.heartbeats_key, dict(write.beats))
        write.pull(pipe)
        return write

    def starting(
        self, fences: Sequence[Fence], queue: str, look_at: float | None = None
    ) -> StartWrite:
        """:meth:`start` with nothing added to a pipeline yet: the caller sends, in this order
        and in one pipeline, a ``ZADD`` of ``write.beats`` to ``orga:heartbeats`` (which it may
        share with other starts of the same loop turn: one ``ZADD`` for all, issue 27,
        :class:`~workers.redis_batch.SharedZadd`), then :meth:`StartWrite.pull`; their replies
        (``write.sent``) go to :meth:`check_start`. Each start still waits for its write
        before its dispatch runs: a call that runs has its heartbeat in Redis, unless Redis
        refused the write as it takes no writes (out of memory, a read-only replica): then
        :meth:`check_start` logs it and the call runs anyway, as before issue 27."""
        ids = [f.liveness_id() for f in fences]
        self._running.update(ids)
        self._starts[queue] += 1
        self._ensure_beating()
        now = time.time()
        marks = self._take_marks()
        beats = {**marks, **dict.fromkeys(ids, now)}
        if self._look_is_near(look_at, now):
            return StartWrite(1, marks, beats)
        # A dispatch that waited in a long queue has its next look far ahead: bring it to one
        # heartbeat timeout from now, so that a death from here on is noticed in time (XX: a
        # task no longer due is not added; LT: an earlier look is kept).
        # The fences of one dispatch are its task's: one partition, one index.
        p = keys.partition_of(fences[0].task_id, self._partitions) if fences else 0
        due = {
            f.task_id: now + self._timeout_s
            for f in fences
            if keys.partition_of(f.task_id, self._partitions) == p
        }
        return StartWrite(2, marks, beats, (keys.deadlines_key(p), due))

    def _look_is_near(self, look_at: float | None, now: float) -> bool:
        """Whether the look the coordinator set at the dispatch is still the task's, and no
        later than one heartbeat timeout from ``now``: then the start's ``ZADD ... XX LT``
        would change nothing (issue 27: one command less per call). Still the task's: it has
        not passed (with :data:`LOOK_SLACK_S` for the clocks), so the coordinator has not
        looked and moved it (a queued dispatch's look goes as far as the queue is long)."""
        if look_at is None:
            return False
        return now + LOOK_SLACK_S < look_at <= now + self._timeout_s

    def check_start(self, replies: Sequence[object], write: StartWrite) -> None:
        """Raise the first error among :meth:`start`'s replies (the first ``write.sent`` of
        ``replies``), but Redis refusing writes (out of memory: the call runs anyway, logged);
        on an error, the answer marks the start carried are given back (:meth:`give_back`)."""
        for reply in replies[: write.sent]:
            if not isinstance(reply, Exception):
                continue
            self.give_back(write)
            if isinstance(reply, TRANSIENT_WRITE_ERRORS):
                log.warning("heartbeat.failed", extra={"error": str(reply)[:300]})
                return
            raise reply

    def give_back(self, write: StartWrite) -> None:
        """The answer marks a start's ``ZADD`` carried, not written (its pipeline failed or
        was not sent): they wait for the next write again. A mark taken again since (a newer
        answer of the same member) is kept."""
        if not write.marks:
            return
        for member, at in write.marks.items():
            self._marks.setdefault(member, at)
        self._ensure_flushing()

    def answered(self, pipe: Pipeline, fences: Iterable[Fence], *, chained: bool = False) -> None:
        """Mark ``fences`` answered in ``pipe``, which publishes the answer (its transaction, or
        the pipeline a single write opens), with how the answer went out
        (:func:`shared.keys.answered_via_member`, in the same ``ZADD``): ``chained``, inside the
        one call a reasoning chained (the coordinator then waits for the tools queue), else on
        the observations stream. Only a reasoning's fence (no call id) is marked so: the
        coordinator reads the marks of an awaited reasoning alone."""
        marks = self._marks_of(fences, chained=chained)
        if marks:
            pipe.zadd(keys.heartbeats_key, marks)

    def answered_later(self, fences: Iterable[Fence]) -> None:
        """Mark ``fences`` answered "direct" (their answer is on the observations stream,
        written already) with the next ``ZADD`` of ``orga:heartbeats`` this process sends: a
        start's, a beat's, or its own at most :data:`MARK_DELAY_S` from now.

        Until then the coordinator sees the dispatch's last beat (or none, for a call started
        and answered within one pipeline of marks) and judges it running (or not started):
        it looks again a heartbeat timeout later, by when the mark is in. Only a worker killed
        in that window leaves no mark, as one killed right after a publish always could: the
        coordinator has the answer, and a re-send is fenced."""
        marks = self._marks_of(fences, chained=False)
        if not marks:
            return
        self._marks.update(marks)
        self._ensure_flushing()

    @staticmethod
    def _marks_of(fences: Iterable[Fence], *, chained: bool) -> dict[str, float]:
        """The answer marks of ``fences`` now (:meth:`answered`)."""
        fences = list(fences)
        if not fences:
            return {}
        at = -time.time()
        via = keys.ANSWERED_CHAINED if chained else keys.ANSWERED_DIRECT
        marks = {f.liveness_id(): at for f in fences}
        reasonings = (f.liveness_id() for f in fences if f.call_id is None)
        marks.update(dict.fromkeys((keys.answered_via_member(i, via) for i in reasonings), at))
        return marks

    def _take_marks(self) -> dict[str, float]:
        """The answer marks waiting, taken for a write (given back if it fails)."""
        marks, self._marks = self._marks, {}
        return marks

    def _ensure_flushing(self) -> None:
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.get_running_loop().create_task(self._flush_marks())

    async def _flush_marks(self) -> None:
        """Write the answer marks no start or beat carried within :data:`MARK_DELAY_S` (a
        failure keeps them for the next try, one delay later)."""
        while self._marks:
            await asyncio.sleep(MARK_DELAY_S)
            await self._write_marks(keep=True)

    async def _write_marks(self, *, keep: bool) -> None:
        """One ``ZADD`` of the marks waiting; on failure, ``keep`` gives them back."""
        marks = self._take_marks()
        if not marks:
            return
        try:
            await self._redis.zadd(keys.heartbeats_key, marks)
        except RedisError as exc:
            log.warning("heartbeat.failed", extra={"error": str(exc)[:300]})
            if keep:
                self._marks = {**marks, **self._marks}
        except asyncio.CancelledError:
            self._marks = {**marks, **self._marks}
            raise

    def finished(self, fences: Iterable[Fence]) -> None:
        """Stop heartbeating ``fences`` (answered, or given up on by this process)."""
        for fence in fences:
            key = fence.liveness_id()
            self._running[key] -= 1
            if self._running[key] <= 0:
                del self._running[key]

    @contextlib.contextmanager
    def watching(self, task_id: str, work: asyncio.Future[Any]) -> Iterator[None]:
        """Cancel ``work`` (a call of task ``task_id``) if a beat finds the task ended while
        the block runs."""
        self._watched.setdefault(task_id, set()).add(work)
        try:
            yield
        finally:
            watched = self._watched.get(task_id, set())
            watched.discard(work)
            if not watched:
                self._watched.pop(task_id, None)

    def _ensure_beating(self) -> None:
        if self._beating is None or self._beating.done():
            self._beating = asyncio.get_running_loop().create_task(self._beat())

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            if not self._running:
                await self._add_starts()
                continue
            watched = list(self._watched)
            pipe = self._redis.pipeline(transaction=False)
            marks = self._take_marks()  # newer than the beats of the same member: they win
            pipe.zadd(keys.heartbeats_key, {**dict.fromkeys(self._running, time.time()), **marks})
            starts = self._take_starts(pipe)
            by_partition: dict[int, list[str]] = {}
            for task_id in watched:  # each task's end is in its partition's index
                p = keys.partition_of(task_id, self._partitions)
                by_partition.setdefault(p, []).append(task_id)
            for p, task_ids in by_partition.items():
                pipe.zmscore(keys.finished_tasks_key(p), task_ids)
            try:
                replies = await pipe.execute()
            except RedisError as exc:  # the next beat tries again; the timeout allows a few
                log.warning("heartbeat.failed", extra={"error": str(exc)[:300]})
                self._starts.update(starts)
                self.give_back(StartWrite(0, marks))
                continue
            except asyncio.CancelledError:  # close() adds them (a reply lost after Redis
                self._starts.update(starts)  # applied them counts a beat's starts twice)
                self.give_back(StartWrite(0, marks))
                raise
            finished_replies = replies[1 + len(starts) :]
            for task_ids, finished in zip(by_partition.values(), finished_replies, strict=True):
                self._cancel_ended(task_ids, finished)

    def _take_starts(self, pipe: Pipeline) -> Counter[str]:
        """Add the starts counted since the last beat to ``pipe`` (one ``INCRBY`` per queue);
        the caller gives them back when the pipeline fails."""
        starts, self._starts = self._starts, Counter()
        for queue, count in starts.items():
            pipe.incrby(keys.queue_started_key(queue), count)
        return starts

    async def _add_starts(self) -> None:
        """Add the starts not added yet, with no dispatch left to beat (a failure keeps them
        for the next beat)."""
        if not self._starts:
            return
        pipe = self._redis.pipeline(transaction=False)
        starts = self._take_starts(pipe)
        try:
            await pipe.execute()
        except RedisError as exc:
            log.warning("heartbeat.failed", extra={"error": str(exc)[:300]})
            self._starts.update(starts)
        except asyncio.CancelledError:
            self._starts.update(starts)
            raise

    def _cancel_ended(self, task_ids: Sequence[str], finished: Sequence[float | None]) -> None:
        """Cancel the calls of the tasks that have ended."""
        for task_id, ended_at in zip(task_ids, finished, strict=True):
            if ended_at is None:
                continue
            for work in self._watched.get(task_id, ()):
                if not work.done():
                    log.info("dispatch.task_ended", extra={"task_id": task_id})
                    work.cancel()

    async def close(self) -> None:
        """Stop the heartbeat task, add the starts it had not added yet and write the answer
        marks still waiting."""
        await _stop(self._beating)
        self._beating = None
        await _stop(self._flushing)  # after the beat: a beat cancelled may have started it
        self._flushing = None
        await self._add_starts()
        await self._write_marks(keep=False)


async def _stop(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (if any) and wait for it to end, cancelling it again while it runs on (a
    beat's pipeline may drop a cancel on Python 3.11: :func:`shared.aio.cancel_and_wait`; its
    clean-up on cancellation awaits nothing)."""
    if task is None:
        return
    await cancel_and_wait(task)
