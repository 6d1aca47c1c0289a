"""The asyncio client: submit, status, result, cancel, decide, and ``wait``/``events`` that block
on the task's streams (``XREAD BLOCK``) instead of polling::

    async with AsyncOrgaClient("redis://127.0.0.1:6379/0") as client:
        task_id = await client.submit({"goal": ..., "steps": [...]})
        async for event in client.events(task_id):
            print(event.kind, event.data)
        result = await client.wait(task_id)   # completed, failed, aborted, or a review open

Following a task is native asyncio (``redis.asyncio``; one connection per watcher while it
blocks). The one-shot reads and writes are :class:`~coordinator.client.OrgaClient`'s, run in a
worker thread: one implementation of the key layout, the idempotency routing and the decision
claim, rather than two that could drift apart.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import redis
from redis.asyncio import Redis

from coordinator.client import (
    SLOT_MOVING_ERRORS,
    SLOT_MOVING_PATIENCE_S,
    WATCH_SOCKET_TIMEOUT_S,
    OrgaClient,
    TaskNotFoundError,
    WaitTimeoutError,
    watch_block_ms,
)
from coordinator.state import ReviewItem
from coordinator.watch import Cursor, TaskEvent, TaskWatch
from shared import keys
from shared.events import JournalEntry
from shared.task_spec import TaskSpec

__all__ = ["AsyncOrgaClient"]


class AsyncOrgaClient:
    """Submits tasks, follows them and decides their reviews, from asyncio code."""

    def __init__(
        self,
        redis_url: str,
        partitions: int | None = None,
        *,
        client: Redis | None = None,
        sync_client: redis.Redis | None = None,
    ) -> None:
        """``client`` and ``sync_client``: the state's clients, ``decode_responses`` on, as
        the assembly builds them (``orga.redis_client.RedisClients``: RedisCluster on a
        cluster; the asyncio one's socket timeout longer than a block); None: a standalone
        Redis at ``redis_url``."""
        self.sync = OrgaClient(redis_url, partitions=partitions, client=sync_client)
        self.redis: Redis = client or Redis.from_url(
            redis_url, decode_responses=True, socket_timeout=WATCH_SOCKET_TIMEOUT_S
        )
        """Blocks in ``XREAD`` (its socket timeout is longer than a block)."""

    async def __aenter__(self) -> AsyncOrgaClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close both connection pools."""
        await self.redis.aclose()
        await asyncio.to_thread(self.sync.close)

    # -- one-shot operations (the sync client's, in a thread) ------------------------------

    async def submit(
        self, task: TaskSpec | dict[str, Any] | str | bytes | Path, task_id: str | None = None
    ) -> str:
        """Put a task on the intake stream; its id (:meth:`OrgaClient.submit`)."""
        return await asyncio.to_thread(self.sync.submit, task, task_id)

    async def status(self, task_id: str) -> dict[str, Any]:
        """Status, step, progress, usage (:meth:`OrgaClient.status`)."""
        return await asyncio.to_thread(self.sync.status, task_id)

    async def result(self, task_id: str) -> dict[str, Any]:
        """What the task produced so far (:meth:`OrgaClient.result`)."""
        return await asyncio.to_thread(self.sync.result, task_id)

    async def journal(self, task_id: str, after: int = -1) -> list[JournalEntry]:
        """The task's journal entries after a sequence (:meth:`OrgaClient.journal`)."""
        return await asyncio.to_thread(self.sync.journal, task_id, after)

    async def cancel(self, task_id: str, reason: str = "cancelled by operator") -> None:
        """Ask the coordinator to abort the task (:meth:`OrgaClient.cancel`)."""
        await asyncio.to_thread(self.sync.cancel, task_id, reason)

    async def reviews(self) -> list[ReviewItem]:
        """The open reviews, oldest first."""
        return await asyncio.to_thread(self.sync.reviews)

    async def review(self, review_id: str) -> ReviewItem:
        """One open review."""
        return await asyncio.to_thread(self.sync.review, review_id)

    async def decide(
        self,
        review_id: str,
        decision: str,
        hint: str | None = None,
        by: str = "api",
        timeout_s: float = 30.0,
        *,
        arguments: dict[str, Any] | None = None,
    ) -> str:
        """Send a decision and wait, blocking on the task's partition's lifecycle events, until
        a coordinator applied it; the task's id. ReviewDecidedError when another decision came
        first or it was refused; WaitTimeoutError when none applied it within ``timeout_s``."""
        sync = self.sync
        task_id, entry = await asyncio.to_thread(
            functools.partial(sync.send_decision, arguments=arguments),
            review_id,
            decision,
            hint,
            by,
        )
        events = keys.events_stream(sync.partition(task_id))
        after = await self._last_id(events)  # read before looking: nothing falls in between
        deadline = time.monotonic() + timeout_s
        while True:
            if await asyncio.to_thread(sync.decision_applied, review_id, task_id, entry):
                return task_id
            if time.monotonic() > deadline:
                raise WaitTimeoutError(
                    f"no coordinator applied the decision within {timeout_s}s; "
                    "is `orga coordinator` running?"
                )
            after = await self._next(events, after, deadline)

    async def _next(self, stream: str, after: str, deadline: float | None) -> str:
        """Block until ``stream`` has an entry after ``after`` (or ``deadline``); its last id."""
        reply = await self.redis.xread({stream: after}, block=watch_block_ms(deadline), count=1000)
        for _name, rows in cast("list[Any]", reply or []):
            after = str(rows[-1][0]) if rows else after
        return after

    # -- following (native asyncio) --------------------------------------------------------

    async def wait(self, task_id: str, timeout_s: float = 600.0) -> dict[str, Any]:
        """Block until the task ends or waits for a review; its result (with ``review_id``
        when a review is open). WaitTimeoutError past ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        real = await self.accepted(task_id, deadline)
        async for event in self.events(real, deadline=deadline):
            if event.kind == "status" and (event.terminal or event.data["review_id"]):
                result = await self.result(real)
                if event.data["review_id"]:
                    result["review_id"] = event.data["review_id"]
                return result
        raise WaitTimeoutError(f"task {task_id} did not finish within {timeout_s}s")

    async def accepted(self, task_id: str, deadline: float | None = None) -> str:
        """The stored task's id once the coordinator accepted it, blocking on the lifecycle
        events until then (:meth:`OrgaClient.accepted`)."""
        events = keys.events_stream(self.sync.partition(task_id))
        after = await self._last_id(events)
        while True:
            try:
                return await asyncio.to_thread(self.sync.existing, task_id)
            except TaskNotFoundError:
                pass
            after = await self._next(events, after, deadline)
            if deadline is not None and time.monotonic() > deadline:
                raise WaitTimeoutError(f"task {task_id} was not accepted in time")

    async def events(
        self, task_id: str, after: str | None = None, deadline: float | None = None
    ) -> AsyncIterator[TaskEvent]:
        """The task's events after the cursor ``after`` (an event's ``id``), as they come,
        until it ends (or ``deadline``, a ``time.monotonic()``, passes). TaskNotFoundError for
        a task not stored (yet: :meth:`accepted` waits for it); CursorError for a bad cursor."""
        cursor = Cursor.parse(after)
        real = await asyncio.to_thread(self.sync.existing, task_id)
        watch = TaskWatch(real, self.sync.partition(real), cursor)
        watch.events_after = await self._last_id(watch.events_stream)
        woke = True
        while True:
            if woke:
                for event in watch.advance(await self._read_together(watch)):
                    yield event
                if watch.ended:
                    return
            if deadline is not None and time.monotonic() > deadline:
                return
            reply = await self.redis.xread(watch.wake_streams(), block=watch_block_ms(deadline))
            woke = watch.woke(reply) or not reply

    async def _read_together(self, watch: TaskWatch) -> list[Any]:
        """The watch's reads in one ``MULTI``, sent again while a Redis Cluster moves their
        slot (:data:`~coordinator.client.SLOT_MOVING_ERRORS`: the transaction did not run),
        for up to :data:`~coordinator.client.SLOT_MOVING_PATIENCE_S`."""
        deadline = time.monotonic() + SLOT_MOVING_PATIENCE_S
        delay_s = 0.1
        while True:
            pipe = self.redis.pipeline(transaction=True)
            watch.queue_reads(pipe)
            try:
                return list(await pipe.execute())
            except SLOT_MOVING_ERRORS:
                if time.monotonic() + delay_s > deadline:
                    raise
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, 1.0)

    async def _last_id(self, stream: str) -> str:
        rows = cast("list[Any]", await self.redis.xrevrange(stream, count=1))
        return str(rows[0][0]) if rows else "0-0"
