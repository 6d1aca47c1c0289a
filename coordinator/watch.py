"""Following one task: its journal, its status and its model's streamed answer, as events.

One model for the API's Server-Sent Events, :meth:`AsyncOrgaClient.events` and both clients'
``wait``. A watcher blocks (``XREAD BLOCK``) on three streams of the task's partition, one slot:
the task's journal, its token stream (deltas of the model's answer, written by the reasoning
workers once they stream) and the partition's lifecycle events (which wake it for a status
change that writes no journal entry: a review opened or decided, an end). Each time something
of its task arrived it reads the journal and token entries after its cursor and the task's
state in one transaction, so a status is never seen before the journal entries committed with
it.

Every event carries the cursor after it, ``{journal id}/{token id}/{status}`` (two Redis stream
ids and the status the watcher last saw), followed by ``/{review id}`` while a review is open:
the SSE event id. Given back (``Last-Event-ID``), it resumes with the entries after both ids and
a status event only when the status or the open review changed since: no gap, no duplicate.

Kinds: ``journal`` (a journal entry, as ``orga journal --json`` prints it), ``status`` (the
task's status or its open review changed: ``status``, ``review_id``, ``error``; a second held
call's review opening as the first is decided is one, the status staying ``awaiting_review``),
``token`` (a delta of the model's answer: the token stream entry's fields) and
``stream_restarted`` (a token stream entry with ``event: stream_restarted``: the answer being
streamed was abandoned, a new one starts; a watcher drops what it showed of it).
The watch ends after the status event of a terminal status.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from coordinator.state import TERMINAL_STATUSES
from shared import keys
from shared.errors import OrgaError
from shared.journal import journal_dicts

__all__ = [
    "Cursor",
    "CursorError",
    "EventKind",
    "TaskEvent",
    "TaskWatch",
]

EventKind = Literal["journal", "status", "token", "stream_restarted"]

_STREAM_ID = r"\d+-\d+"
_CURSOR = re.compile(rf"^({_STREAM_ID})/({_STREAM_ID})/([a-z_]*)(?:/([A-Za-z0-9_-]+))?$")
_TERMINAL = frozenset(s.value for s in TERMINAL_STATUSES)


class CursorError(OrgaError, ValueError):
    """A ``Last-Event-ID`` that is not a cursor this API gave out."""


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a watcher is: the last journal and token stream ids it has, the status and the
    open review (``""``: none) it saw."""

    journal: str = "0-0"
    tokens: str = "0-0"
    status: str = ""
    review: str = ""

    def __str__(self) -> str:
        text = f"{self.journal}/{self.tokens}/{self.status}"
        return f"{text}/{self.review}" if self.review else text

    @classmethod
    def parse(cls, text: str | None) -> Cursor:
        """The cursor an event id holds; the start for None or an empty text."""
        if not text:
            return cls()
        found = _CURSOR.match(text.strip())
        if found is None:
            raise CursorError(
                f"Last-Event-ID {text[:80]!r} is not an event id of this API (expected "
                "`<journal id>/<token id>/<status>`, e.g. `0-12/0-0/running`); send the id "
                "of the last event received, or none to start from the beginning"
            )
        journal, tokens, status, review = found.groups()
        return cls(journal, tokens, status, review or "")


@dataclass(frozen=True, slots=True)
class TaskEvent:
    """One event of a task: its kind, its data, and the cursor after it (``id``)."""

    id: str
    kind: EventKind
    data: dict[str, Any]

    @property
    def terminal(self) -> bool:
        """A status event of a task that ended (the last event of a watch)."""
        return self.kind == "status" and self.data.get("status") in _TERMINAL


@dataclass
class TaskWatch:
    """The state of one watcher: which streams to block on, what to read, what to emit.

    Pure (no I/O): the sync and the async client run the same steps with their own Redis::

        watch.events_after = last id of the events stream (read before anything else)
        reply = XREAD BLOCK ... STREAMS watch.wake_streams()    # skipped the first time
        if watch.woke(reply):  MULTI, watch.queue_reads(pipe), EXEC -> watch.advance(replies)
    """

    task_id: str
    partition: int
    cursor: Cursor = field(default_factory=Cursor)
    events_after: str = "0-0"
    ended: bool = False

    @property
    def journal_stream(self) -> str:
        return keys.journal_stream(self.task_id, self.partition)

    @property
    def token_stream(self) -> str:
        return keys.tokens_stream(self.task_id, self.partition)

    @property
    def events_stream(self) -> str:
        return keys.events_stream(self.partition)

    def wake_streams(self) -> dict[Any, Any]:
        """The streams to block on, each after what was seen (one slot: the task's partition)."""
        return {
            self.journal_stream: self.cursor.journal,
            self.token_stream: self.cursor.tokens,
            self.events_stream: self.events_after,
        }

    def woke(self, reply: Any) -> bool:
        """Note what an ``XREAD`` returned; True when any of it is about this task."""
        ours = False
        for name, entries in _stream_rows(reply):
            if name != self.events_stream:
                ours = ours or bool(entries)
                continue
            for entry_id, fields in entries:
                self.events_after = entry_id
                ours = ours or fields.get("task_id") == self.task_id
        return ours

    def queue_reads(self, pipe: Any) -> None:
        """Queue, on a transaction pipeline, the reads :meth:`advance` takes."""
        pipe.xrange(self.journal_stream, min=f"({self.cursor.journal}", max="+")
        pipe.xrange(self.token_stream, min=f"({self.cursor.tokens}", max="+")
        pipe.hget(keys.task_key(self.task_id, self.partition), "state")

    def advance(self, replies: list[Any]) -> list[TaskEvent]:
        """The events the reads of :meth:`queue_reads` hold, in order: the journal entries,
        the token deltas, then the status when it or the open review changed."""
        journal, tokens, state = replies
        found: list[TaskEvent] = []
        for entry_id, fields in _rows(journal):
            # One stream entry holds a commit's records (shared.journal); the cursor names the
            # last record given, ``0-{sequence+1}``, as if each had its entry.
            for record in journal_dicts(fields, after=_sequence_seen(self.cursor.journal)):
                sequence = record.get("sequence")
                at = f"0-{sequence + 1}" if isinstance(sequence, int) else entry_id
                self.cursor = replace(self.cursor, journal=at)
                found.append(self._event("journal", record))
        for entry_id, fields in _rows(tokens):
            self.cursor = replace(self.cursor, tokens=entry_id)
            restarted = fields.get("kind") == "stream_restarted"
            found.append(self._event("stream_restarted" if restarted else "token", fields))
        status = _status(state)
        review = (status or {}).get("review_id") or ""
        if status is not None and (status["status"], review) != (
            self.cursor.status,
            self.cursor.review,
        ):
            self.cursor = replace(self.cursor, status=status["status"], review=review)
            found.append(self._event("status", {"task_id": self.task_id, **status}))
        # A task seen once and gone now was purged (its retention passed): nothing more comes.
        self.ended = self.cursor.status in _TERMINAL or (
            status is None and bool(self.cursor.status)
        )
        return found

    def _event(self, kind: EventKind, data: dict[str, Any]) -> TaskEvent:
        return TaskEvent(id=str(self.cursor), kind=kind, data=data)


def _sequence_seen(journal_id: str) -> int:
    """The last journal sequence a cursor's journal id ``0-{sequence+1}`` says was given."""
    _ms, _, seq = journal_id.partition("-")
    return int(seq) - 1 if seq.isdigit() else -1


def _status(state: Any) -> dict[str, Any] | None:
    """The status, open review and error of a task's stored state (None: not stored)."""
    if state is None:
        return None
    record = json.loads(state)
    review = record.get("review") or {}
    return {
        "status": str(record.get("status")),
        "review_id": review.get("review_id") if review.get("decision") is None else None,
        "error": record.get("error"),
    }


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _rows(entries: Any) -> list[tuple[str, dict[str, str]]]:
    return [(_text(entry_id), _fields(fields)) for entry_id, fields in entries or []]


def _fields(fields: Any) -> dict[str, str]:
    """An entry's fields: a dict, or the flat ``[name, value, ...]`` list Redis sends, which
    redis-py's cluster transaction pipeline hands over without its usual parsing."""
    if isinstance(fields, dict):
        return {_text(k): _text(v) for k, v in fields.items()}
    flat = list(fields or [])
    return {_text(k): _text(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}


def _stream_rows(reply: Any) -> list[tuple[str, list[tuple[str, dict[str, str]]]]]:
    """An ``XREAD`` reply as (stream, entries), in RESP2 (a list) or RESP3 (a map)."""
    if not reply:
        return []
    pairs = reply.items() if isinstance(reply, dict) else reply
    return [(_text(name), _rows(entries[0] if isinstance(reply, dict) else entries))
            for name, entries in pairs]  # fmt: skip
