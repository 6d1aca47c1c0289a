"""Small non-transactional pipelines of many coroutines, sent as one (a worker's hot path).

A reasoning worker holds 200 model calls in flight on one event loop. Each call's start
(heartbeat, conversation read-ahead, rate-limit hold), each inline tool call's breaker check
and each single-write publish (the observation, or a chained call and its mark: no
``MULTI``) is a pipeline of one to five commands of its own: a round trip each, paying redis-py's
per-pipeline overhead (a connection out of the pool and back, a socket write, the retry and
metrics wrapping) for a handful of commands. :class:`CoalescedPipeline` sends every such
pipeline asked for during one turn of the event loop as **one** pipeline, and hands each
caller the slice of replies its own commands produced.

Semantics, as each caller's own ``pipe.execute(raise_on_error=False)`` had them:

* a command's error reply (``ResponseError``, ``NoScriptError``) is in the caller's replies,
  where its command is; other callers' errors never reach it;
* an exception of the whole pipeline (the connection lost, a timeout) is raised to every
  caller of that pipeline, each raising it as it would have alone; a caller's argument that
  redis-py cannot encode (``DataError``, raised before anything is sent) sends each caller's
  commands in a pipeline of its own, so that only that caller raises it;
* a caller cancelled before its pipeline goes out has its commands taken out (they are not
  sent); a caller cancelled while it is out does not cancel it for the others (the flush is a
  task of its own); no command is ever sent twice by the batch (redis-py's own retry on a
  connection error, configured on the client, applies as it did to each pipeline).

Shared ``ZADD``: a caller may hand :meth:`CoalescedPipeline.run` members for a sorted set
(:class:`SharedZadd`, a plain ``ZADD``: no flag) apart from its commands; the batch sends the
members of every caller for the same key as **one** ``ZADD`` (issue 27: a reasoning worker's
starts of one loop turn, each a ``ZADD`` of ``orga:heartbeats``, are one command), written
where the first of them was, and each of those callers gets that command's reply as its first.
Nothing of the order on that key changes: a caller whose own commands name the key ends the
merge, and the members of the callers after it go in a ``ZADD`` of their own after those
commands; within one ``ZADD`` a member given twice takes the later caller's score, as two
``ZADD`` in a row would leave it. Keys and members are compared as redis-py sends them
(``"k"`` and ``b"k"`` are one key, ``str`` encoded as the client encodes it, utf-8 by
default). Its reply (how many members were new) is the merged command's, an error reply every
contributor's (as each would have had it alone). A caller's members with a score Redis may
refuse (NaN; anything but a ``float`` or a short ``int``) or a name redis-py cannot encode
are not merged: they go in a ``ZADD`` of the caller's own, in its place, which is a write of
the key by that caller (it ends the merge), so that its error reaches it only.

Commands of different callers are not atomic together, nor were they: none of this is for
``MULTI`` transactions (a worker's publish of two writes or more keeps its own, all or
nothing per task).

Scripts: a builder would call ``pipe.evalsha(script.sha, ...)``, not ``script(...,
client=pipe)``, which would make redis-py ask ``SCRIPT EXISTS`` in a round trip of its own
before each pipeline; a ``NoScriptError`` reply (Redis restarted, ``SCRIPT FLUSH``) means the
script did not run, and the caller runs it through the script object, which loads it. (No
builder of the worker runs a script since issue 27: the breaker check is an ``HMGET``.)
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import DataError

__all__ = [
    "MAX_BATCH_COMMANDS",
    "CoalescedPipeline",
    "OwnPipeline",
    "PipelineRunner",
    "SharedZadd",
]

MAX_BATCH_COMMANDS: Final = 512
"""A batch with this many commands goes out at once, without waiting for the loop's turn to
end (bounds one write and the replies one read parses before waking anyone)."""

Build = Callable[[Pipeline], object]
"""Adds a caller's commands to a non-transactional pipeline (what it returns is ignored)."""


@dataclass(frozen=True, slots=True)
class SharedZadd:
    """Members a caller adds to the sorted set ``key`` with a plain ``ZADD`` (no flag), which
    a :class:`CoalescedPipeline` may send together with other callers' members for ``key``
    (one command); its reply comes first in the caller's replies. No members: no command.
    Names are compared as redis-py sends them: ``"k"`` and ``b"k"`` are one key (or member)."""

    key: str | bytes
    members: Mapping[str, float] | Mapping[bytes, float]


class PipelineRunner(Protocol):
    """Runs a caller's commands in a non-transactional pipeline."""

    async def run(self, build: Build, zadd: SharedZadd | None = None) -> list[Any]:
        """The replies of the commands ``build`` adds, in order, after the reply of ``zadd``
        (when it has members); an error reply is the exception in its place
        (``raise_on_error=False``); a failure of the pipeline raises."""
        ...


class OwnPipeline:
    """One pipeline, one round trip per caller: the behaviour without coalescing."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def run(self, build: Build, zadd: SharedZadd | None = None) -> list[Any]:
        """``zadd``'s ``ZADD`` and ``build``'s commands in a pipeline of their own."""
        pipe = self._redis.pipeline(transaction=False)
        _add_zadd(pipe, zadd)
        build(pipe)
        return list(await pipe.execute(raise_on_error=False))

    async def aclose(self) -> None:
        """Nothing to wait for: each caller awaits its own pipeline."""


@dataclass(slots=True)
class _Caller:
    commands: list[Any]
    """The (args, options) entries ``build`` put on the pipeline's command stack."""
    replies: asyncio.Future[list[Any]]
    zadd: SharedZadd | None = None
    """Members for a ``ZADD`` the batch may share with other callers (None: none)."""


@dataclass(slots=True)
class _Batch:
    pipe: Pipeline
    callers: list[_Caller] = field(default_factory=list)
    size: int = 0
    flush: asyncio.Handle | None = None


class CoalescedPipeline:
    """Every pipeline asked for in one turn of the event loop, sent as one.

    Built and used on one event loop (the worker process's). ``max_commands`` sends a batch
    early once it holds that many commands.
    """

    def __init__(self, redis: Redis, *, max_commands: int = MAX_BATCH_COMMANDS) -> None:
        if max_commands < 1:
            raise ValueError(
                f"max_commands={max_commands!r}: a batch must hold at least one command; "
                "pass 1 to send every caller's pipeline on its own"
            )
        self._redis = redis
        self._max_commands = max_commands
        self._open: _Batch | None = None
        self._flushing: set[asyncio.Task[None]] = set()
        self.batches_sent = 0
        """How many pipelines went out (for tests and benchmarks)."""

    async def run(self, build: Build, zadd: SharedZadd | None = None) -> list[Any]:
        """``build``'s commands in the batch of this loop turn, after ``zadd``'s members (in a
        ``ZADD`` shared with the batch's other callers for the same key: see the module); the
        replies once it is back, the ``ZADD``'s first."""
        if zadd is not None and not zadd.members:
            zadd = None
        loop = asyncio.get_running_loop()
        batch = self._open
        if batch is None:
            batch = self._open = _Batch(self._redis.pipeline(transaction=False))
            batch.flush = loop.call_soon(self._send, batch)
        stack = batch.pipe.command_stack
        try:
            build(batch.pipe)
        finally:  # the caller's commands, kept apart until the batch goes out
            commands = stack[:]
            stack.clear()
        if not commands and zadd is None:
            return []
        caller = _Caller(commands, loop.create_future(), zadd)
        batch.callers.append(caller)
        batch.size += len(commands) + (zadd is not None)
        if batch.size >= self._max_commands:
            self._send(batch)
        return await caller.replies

    def _send(self, batch: _Batch) -> None:
        """Close the batch and send it from a task of its own (no caller can cancel it)."""
        if self._open is batch:
            self._open = None
        if batch.flush is not None:
            batch.flush.cancel()
            batch.flush = None
        live = [c for c in batch.callers if not c.replies.done()]  # cancelled: not sent
        if not live:
            return
        layout = _lay_out(batch.pipe, live)
        task = asyncio.get_running_loop().create_task(self._execute(batch.pipe, live, layout))
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    async def _execute(
        self, pipe: Pipeline, callers: list[_Caller], layout: list[tuple[int | None, int, int]]
    ) -> None:
        self.batches_sent += 1
        try:
            replies = await pipe.execute(raise_on_error=False)
        except asyncio.CancelledError:  # the loop shuts down: so do the callers
            for caller in callers:
                caller.replies.cancel()
            raise
        except DataError:  # a caller's argument redis-py cannot encode: nothing was sent
            await asyncio.gather(*(self._alone(caller) for caller in callers))
            return
        except Exception as exc:
            for caller in callers:
                if not caller.replies.done():
                    caller.replies.set_exception(exc)
            return
        for caller, (shared, start, count) in zip(callers, layout, strict=True):
            if caller.replies.done():
                continue
            own = replies[start : start + count]
            caller.replies.set_result(own if shared is None else [replies[shared], *own])

    async def _alone(self, caller: _Caller) -> None:
        """``caller``'s commands in a pipeline of their own (its own error its own)."""
        pipe = self._redis.pipeline(transaction=False)
        _add_zadd(pipe, caller.zadd)
        pipe.command_stack.extend(caller.commands)
        try:
            replies = await pipe.execute(raise_on_error=False)
        except Exception as exc:
            if not caller.replies.done():
                caller.replies.set_exception(exc)
            return
        if not caller.replies.done():
            caller.replies.set_result(list(replies))

    async def aclose(self) -> None:
        """Wait for the batches already out (those not yet sent go out first)."""
        if self._open is not None:
            self._send(self._open)
        if self._flushing:
            await asyncio.gather(*self._flushing, return_exceptions=True)


def _add_zadd(pipe: Pipeline, zadd: SharedZadd | None) -> None:
    """``zadd``'s ``ZADD`` on ``pipe``, if it has members."""
    if zadd is not None and zadd.members:
        members: dict[Any, float] = dict(zadd.members)
        pipe.zadd(zadd.key, members)


_SURE_INT: Final = 2**63
"""An ``int`` score below this in magnitude is one Redis takes (a longer one may be refused)."""


def _sure_score(score: object) -> bool:
    """Whether Redis takes ``score`` as redis-py sends it (its ``repr``): a ``float`` but NaN
    (``inf`` is valid), or a short ``int``; anything else may be refused (a ``str``, a
    ``float`` subclass, whose ``repr`` is not a number)."""
    if type(score) is float:
        return not math.isnan(score)
    return type(score) is int and -_SURE_INT < score < _SURE_INT


def _encoded(encoder: Any, value: object) -> bytes | None:
    """``value`` as redis-py sends it (``str`` in the client's encoding, utf-8 by default;
    ``bytes`` as is; ``int`` and ``float`` by ``repr``), None if it cannot be encoded (a
    ``DataError``, or a ``str`` the encoding refuses: redis-py raises either once it sends):
    the common types first, as redis-py's ``Encoder.encode`` does them (which is slower, and
    every argument of a batch's callers may be encoded here)."""
    try:
        if isinstance(value, str):
            return value.encode(encoder.encoding, encoder.encoding_errors)
        if isinstance(value, bytes):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return repr(value).encode()
        return bytes(encoder.encode(value))
    except (DataError, UnicodeError):
        return None


def _merged_form(encoder: Any, zadd: SharedZadd) -> tuple[bytes, dict[bytes, Any]] | None:
    """``zadd``'s key and members as sent (one key, one member, however spelt; a member given
    twice keeps its later score), or None if it must go in a ``ZADD`` of its own: a score
    Redis may refuse (it would refuse the whole command) or a name that cannot be encoded."""
    key = _encoded(encoder, zadd.key)
    members: dict[bytes, Any] = {}
    for member, score in zadd.members.items():
        name = _encoded(encoder, member)
        if name is None or not _sure_score(score):
            return None
        members[name] = score
    return None if key is None else (key, members)


def _lay_out(pipe: Pipeline, callers: list[_Caller]) -> list[tuple[int | None, int, int]]:
    """Put ``callers``' commands on ``pipe``, their shared ``ZADD`` merged per key (see the
    module): for each caller, the index of the ``ZADD`` reply it shares (None: none), and the
    index and count of its own commands' (a ``ZADD`` of its own first, when it is not merged).
    Keys and members are compared as sent (:func:`_encoded`): ``"k"`` and ``b"k"`` are one."""
    encoder = pipe.get_encoder()  # type: ignore[no-untyped-call]
    stack = pipe.command_stack
    merged: dict[bytes, tuple[int, dict[bytes, Any]]] = {}
    """Key -> the index of its open ``ZADD`` in the stack and its members."""
    shares: dict[int, tuple[bytes, dict[bytes, Any]]] = {}
    """The index of each merged ``ZADD`` in the stack -> its key and members."""
    layout: list[tuple[int | None, int, int]] = []
    for caller in callers:
        shared: int | None = None
        commands = caller.commands
        if caller.zadd is not None:
            form = _merged_form(encoder, caller.zadd)
            if form is None:  # its own ZADD, its own reply: its error reaches no one else
                pipe.command_stack = []
                _add_zadd(pipe, caller.zadd)
                commands = [*pipe.command_stack, *commands]
                pipe.command_stack = stack
            else:
                key, members = form
                if key not in merged:  # a placeholder, filled once every member is known
                    merged[key] = (len(stack), {})
                    shares[len(stack)] = (key, merged[key][1])
                    stack.append(((), {}))
                shared = merged[key][0]
                merged[key][1].update(members)
        layout.append((shared, len(stack), len(commands)))
        stack.extend(commands)
        if merged:  # a command of the caller's own on a key ends that key's shared ZADD
            for args, _options in commands:
                for arg in args[1:]:  # after the command's name
                    name = _encoded(encoder, arg)
                    if name is not None:
                        merged.pop(name, None)
    scratch = pipe.command_stack = []
    for at, (key, members) in shares.items():
        pipe.zadd(key, members)
        stack[at] = scratch.pop()
    pipe.command_stack = stack
    return layout
