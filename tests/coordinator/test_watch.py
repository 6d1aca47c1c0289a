"""The watch model (coordinator/watch.py): cursors as event ids, and the events a watcher
emits from what it read; pure, with replies shaped as redis-py gives them."""

from __future__ import annotations

import json

import pytest

from coordinator.watch import Cursor, CursorError, TaskWatch
from shared import keys


def _entry(sequence: int) -> tuple[str, dict[str, str]]:
    return f"0-{sequence + 1}", {
        "sequence": str(sequence),
        "data": json.dumps({"sequence": sequence}),
    }


def _state(status: str, review: dict[str, object] | None = None) -> str:
    return json.dumps({"status": status, "review": review, "error": None})


def test_a_cursor_round_trips_and_a_bad_one_is_named() -> None:
    """``{journal}/{tokens}/{status}`` parses back to itself; none is the start; anything
    else is a CursorError naming the value and the fix."""
    cursor = Cursor("0-12", "1765000000000-3", "awaiting_review")
    assert Cursor.parse(str(cursor)) == cursor
    assert Cursor.parse(None) == Cursor() == Cursor.parse("")
    with pytest.raises(CursorError, match=r"'yesterday'.*send the id of the last event"):
        Cursor.parse("yesterday")


def test_advance_emits_journal_tokens_then_a_changed_status() -> None:
    """Journal entries, token deltas (a ``stream_restarted`` one by its kind), then the status
    when it changed, each with the cursor after it; the same status again emits nothing; a
    terminal status ends the watch."""
    watch = TaskWatch("t1", 0)
    tokens = [("5-0", {"kind": "token", "text": "Hel"}), ("6-0", {"kind": "stream_restarted"})]
    events = watch.advance([[_entry(0), _entry(1)], tokens, _state("running")])
    assert [e.kind for e in events] == ["journal", "journal", "token", "stream_restarted", "status"]
    assert [e.id for e in events] == ["0-1/0-0/", "0-2/0-0/", "0-2/5-0/", "0-2/6-0/",
                                      "0-2/6-0/running"]  # fmt: skip
    assert watch.advance([[], [], _state("running")]) == []
    review = {"review_id": "r1", "decision": None}
    (opened,) = watch.advance([[], [], _state("awaiting_review", review)])
    assert opened.data["review_id"] == "r1" and not opened.terminal and not watch.ended
    (ended,) = watch.advance([[_entry(2)], [], _state("completed")])[-1:]
    assert ended.terminal and watch.ended and ended.id == "0-3/6-0/completed"


def test_woke_is_true_only_for_this_task() -> None:
    """An XREAD reply wakes the watcher for its own journal or tokens, or a lifecycle event
    of its task, never for another task's event (whose id it still moves past)."""
    watch = TaskWatch("t1", 0)
    events = keys.events_stream(0)
    assert not watch.woke([[events, [("9-0", {"task_id": "t2", "event": "completed"})]]])
    assert watch.events_after == "9-0"
    assert watch.woke([[events, [("10-0", {"task_id": "t1", "event": "escalated"})]]])
    assert watch.woke({keys.journal_stream("t1", 0): [[_entry(0)]]})  # RESP3: a map
    assert watch.wake_streams()[events] == "10-0"


def test_a_task_purged_while_watched_ends_the_watch() -> None:
    """A task whose state is gone after it was seen (the retention purge) ends the watch; one
    not stored yet does not."""
    watch = TaskWatch("t1", 0)
    assert watch.advance([[], [], None]) == [] and not watch.ended
    watch.advance([[], [], _state("running")])
    assert watch.advance([[], [], None]) == [] and watch.ended


def test_a_second_held_calls_review_is_a_status_event() -> None:
    """Held calls A and B: A decided, B's review opens with the status still
    ``awaiting_review``; the watcher emits a status event carrying B's review id, its cursor
    names B, and a watcher resuming from A's cursor gets B's review (resuming from B's: none)."""
    watch = TaskWatch("t1", 0)
    (first,) = watch.advance([[], [], _state("awaiting_review", {"review_id": "a1"})])
    assert first.data["review_id"] == "a1" and first.id == "0-0/0-0/awaiting_review/a1"
    assert Cursor.parse(first.id) == Cursor("0-0", "0-0", "awaiting_review", "a1")
    (second,) = watch.advance([[], [], _state("awaiting_review", {"review_id": "b2"})])
    assert second.kind == "status" and second.data["review_id"] == "b2"
    assert second.id == "0-0/0-0/awaiting_review/b2"
    assert watch.advance([[], [], _state("awaiting_review", {"review_id": "b2"})]) == []
    resumed = TaskWatch("t1", 0, Cursor.parse(first.id))
    (caught_up,) = resumed.advance([[], [], _state("awaiting_review", {"review_id": "b2"})])
    assert caught_up.data["review_id"] == "b2"
    current = TaskWatch("t1", 0, Cursor.parse(second.id))
    assert current.advance([[], [], _state("awaiting_review", {"review_id": "b2"})]) == []
    (running,) = watch.advance([[], [], _state("running")])
    assert running.id == "0-0/0-0/running" and running.data["review_id"] is None


def test_entries_read_as_flat_lists_read_as_dicts() -> None:
    """redis-py's cluster transaction pipeline hands XRANGE's entries over unparsed (fields as
    a flat ``[name, value, ...]`` list): they read the same as the parsed ones."""
    watch = TaskWatch("t1", 0)
    flat = [("5-0", ["kind", "token", "text", "Hel"])]
    parsed = [("5-0", {"kind": "token", "text": "Hel"})]
    events = watch.advance([[], flat, _state("running")])
    again = TaskWatch("t1", 0).advance([[], parsed, _state("running")])
    assert [(e.kind, e.data) for e in events] == [(e.kind, e.data) for e in again]
    assert events[0].data["text"] == "Hel"


def test_a_commits_records_in_one_entry_are_events_of_their_own() -> None:
    """A stream entry carrying several records (one commit's) gives one journal event each,
    with the cursor after each record; resumed from a cursor in the middle of that entry, the
    watch gives the records after it only."""
    records = [json.dumps({"sequence": n}) for n in (0, 1, 2)]
    entry = ("0-3", {"sequence": "2", "first": "0", "entries": "[" + ",".join(records) + "]"})
    watch = TaskWatch("t1", 0)
    events = watch.advance([[entry], [], _state("running")])
    assert [e.data.get("sequence") for e in events if e.kind == "journal"] == [0, 1, 2]
    assert [e.id for e in events] == ["0-1/0-0/", "0-2/0-0/", "0-3/0-0/", "0-3/0-0/running"]
    resumed = TaskWatch("t1", 0, Cursor.parse(events[0].id))
    again = resumed.advance([[entry], [], _state("running")])
    assert [e.data.get("sequence") for e in again if e.kind == "journal"] == [1, 2]
