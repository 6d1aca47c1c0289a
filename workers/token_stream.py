"""The worker's token sink: a streamed model answer, published as it comes for watchers.

A reasoning dispatch made with ``ORGA_STREAM_TOKENS`` on (the default) runs its model call
inside :func:`~workers.providers.streaming.streaming_to` a :class:`RedisTokenSink`, which
appends the answer's text to the task's tokens stream, ``orga:{p:NN}:tokens:{task_id}``
(``shared.keys.tokens_stream``, in the task's partition; ``MAXLEN ~ keys.tokens_maxlen``, the
key expiring ``keys.tokens_ttl_s`` after its last write). Entry fields, all strings:

==============  =================================================================
``kind``        ``token`` (a piece of text), ``stream_restarted`` (forget the text
                of this step and iteration so far: the answer starts again) or
                ``stream_done`` (the answer is whole)
``step``        the step id
``iteration``   the iteration the answer is for: the number its ``ReasoningComplete``
                carries in the journal (the fence's iteration + 1)
``attempt``     the dispatch's attempt (the fence's)
``purpose``     ``act``, ``plan`` or ``critic``
``text``        the piece of text (``token`` only)
==============  =================================================================

Pieces are coalesced: a burst's first piece is written at once, the next ones wait until
``flush_every_s`` (50 ms) after the last write began and go together in one ``XADD``, so a fast
model costs at most 20 writes a second, not one per token, and a watcher sees text at most
50 ms late. The end of the answer (or a restart) is written at once, after the pieces before
it. The key's expiry is set with the first and the last write of an answer.

Never a mix of two answers: the first write of a call looks at the stream's last entry; when it
is of the same step, iteration and purpose (an answer that a killed or failed dispatch began,
or finished without its iteration being recorded), ``stream_restarted`` goes first. A call that
retries after a stream broke mid-answer says ``stream_restarted`` too
(:class:`~workers.providers.streaming.StreamReader`). The final assistant message in the
conversation stays the record: the stream is a view, and Redis refusing a write never fails
the call (it is logged and the rest of that answer is not published).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared import keys
from shared.protocol import Fence
from shared.tokens import TokenEntry, token_entry
from workers.providers.streaming import TokenKind

__all__ = ["ListTokenSink", "RedisTokenSink", "answer_fields"]

log = logging.getLogger("orga.worker.tokens")


class RedisTokenSink:
    """Publishes one dispatch's streamed answer to its task's tokens stream."""

    def __init__(
        self,
        redis: Redis,
        fence: Fence,
        purpose: str = "act",
        *,
        partitions: int = 1,
        maxlen: int = keys.tokens_maxlen,
        ttl_s: int = keys.tokens_ttl_s,
        flush_every_s: float = 0.05,
    ) -> None:
        self._redis = redis
        self._stream = keys.tokens_stream(
            fence.task_id, keys.partition_of(fence.task_id, partitions)
        )
        self._fields = answer_fields(fence, purpose)
        self._maxlen = maxlen
        self._ttl_s = ttl_s
        self._flush_every_s = flush_every_s
        self._hurry = asyncio.Event()
        self._pending: list[str] = []
        self._writer: asyncio.Task[None] | None = None
        self._opened = False
        self._broken = False

    async def emit(self, kind: TokenKind, text: str = "") -> None:
        """A piece of text is queued for the writer; a restart or the end waits for the pieces
        before it, then is written."""
        if kind == "token":
            self._pending.append(text)
            if self._writer is None or self._writer.done():
                self._writer = asyncio.create_task(self._write_pending())
            return
        if self._writer is not None:
            self._hurry.set()
            await self._writer
        await self._open()
        await self._write(kind, expire=True)

    async def _write_pending(self) -> None:
        await self._open()
        loop = asyncio.get_running_loop()
        while self._pending:
            began = loop.time()
            text = "".join(self._pending)
            self._pending.clear()
            await self._write("token", text)
            await self._pause(self._flush_every_s - (loop.time() - began))

    async def _pause(self, seconds: float) -> None:
        """Let pieces gather for ``seconds``, unless the answer ends meanwhile."""
        if seconds <= 0 or self._hurry.is_set():
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._hurry.wait()

    async def _open(self) -> None:
        """Before this call's first write: a restart when the last entry is of the same answer."""
        if self._opened:
            return
        self._opened = True
        try:
            last = await self._redis.xrevrange(self._stream, count=1)
        except RedisError as exc:
            self._fail(exc)
            return
        if last and self._same_answer(last[0][1] or {}):
            await self._write("stream_restarted")
        await self._expire()

    def _same_answer(self, entry: dict[bytes | str, bytes | str]) -> bool:
        fields = {_text(k): _text(v) for k, v in entry.items()}
        return _same_answer(fields, self._fields)

    async def _write(self, kind: TokenKind, text: str = "", *, expire: bool = False) -> None:
        if self._broken:
            return
        fields = {"kind": kind, **self._fields}
        if kind == "token":
            fields["text"] = text
        try:
            await self._redis.xadd(self._stream, fields, maxlen=self._maxlen, approximate=True)  # type: ignore[arg-type]
        except RedisError as exc:
            self._fail(exc)
        if expire:
            await self._expire()

    async def _expire(self) -> None:
        if self._broken:
            return
        try:
            await self._redis.expire(self._stream, self._ttl_s)
        except RedisError as exc:
            self._fail(exc)

    def _fail(self, exc: RedisError) -> None:
        self._broken = True
        log.warning("tokens.unpublished", extra={"stream": self._stream, "error": str(exc)[:300]})


class ListTokenSink:
    """The in-process driver's sink: the entries a :class:`RedisTokenSink` writes, with the
    same fields and the same ``stream_restarted`` rule, appended to a run's list (ids
    ``1-0``, ``2-0``, ...). Nothing to coalesce: each piece is one entry."""

    def __init__(self, entries: list[TokenEntry], fence: Fence, purpose: str = "act") -> None:
        self._entries = entries
        self._fields = answer_fields(fence, purpose)
        self._opened = False

    async def emit(self, kind: TokenKind, text: str = "") -> None:
        """One entry; a restart first when the list's last entry is of the same answer."""
        if not self._opened:
            self._opened = True
            last = self._entries[-1] if self._entries else None
            if last is not None and _same_answer(
                {"step": last.step, "iteration": str(last.iteration), "purpose": last.purpose},
                self._fields,
            ):
                self._append("stream_restarted")
        self._append(kind, text)

    def _append(self, kind: TokenKind, text: str = "") -> None:
        fields = {"kind": kind, **self._fields}
        if kind == "token":
            fields["text"] = text
        entry = token_entry(f"{len(self._entries) + 1}-0", fields)
        assert entry is not None  # the fields are a token entry's by construction
        self._entries.append(entry)


def answer_fields(fence: Fence, purpose: str) -> dict[str, str]:
    """The fields every entry of one dispatch's answer carries (the table above)."""
    return {
        "step": fence.step_id,
        "iteration": str(fence.iteration + 1),
        "attempt": str(fence.attempt),
        "purpose": purpose,
    }


def _same_answer(fields: dict[str, str], answer: dict[str, str]) -> bool:
    """Whether an entry's ``fields`` are of the ``answer`` (its step, iteration and purpose)."""
    return all(fields.get(name) == answer[name] for name in ("step", "iteration", "purpose"))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
