"""Reading the tokens stream: entries parsed from Redis fields, and the answer a watcher shows
(restarts start it over, a new step or iteration is a new answer)."""

from __future__ import annotations

from shared.tokens import AnswerView, TokenEntry, token_entry


def _entry(kind: str, text: str = "", iteration: int = 1, attempt: int = 0) -> TokenEntry:
    fields = {"kind": kind, "step": "s", "iteration": str(iteration), "attempt": str(attempt)}
    parsed = token_entry(
        b"1-0", {k.encode(): v.encode() for k, v in {**fields, "text": text}.items()}
    )
    assert parsed is not None
    return parsed


def test_entries_parse_from_bytes_and_refuse_junk() -> None:
    """Bytes or str fields; an unknown kind or a non-numeric iteration is no entry."""
    entry = _entry("token", "hi")
    assert (entry.id, entry.kind, entry.iteration, entry.purpose, entry.text) == (
        "1-0",
        "token",
        1,
        "act",
        "hi",
    )
    assert token_entry("2-0", {"kind": "other", "iteration": "1", "attempt": "0"}) is None
    assert token_entry("2-0", {"kind": "token", "iteration": "x", "attempt": "0"}) is None
    assert entry.as_json()["kind"] == "token"


def test_a_watcher_shows_one_whole_answer() -> None:
    """Pieces join; a restart forgets them; a new iteration starts a new answer."""
    view = AnswerView()
    for entry in (
        _entry("token", "half "),
        _entry("stream_restarted", attempt=1),
        _entry("token", "whole ", attempt=1),
        _entry("token", "answer", attempt=1),
        _entry("stream_done", attempt=1),
    ):
        view.apply(entry)
    assert (view.text, view.done, view.restarts) == ("whole answer", True, 1)
    view.apply(_entry("token", "next", iteration=2))
    assert (view.text, view.done, view.answer) == ("next", False, ("s", 2, "act"))


def test_an_old_attempt_still_streaming_is_dropped() -> None:
    """Attempt 0 of an answer keeps streaming after attempt 1 started (its worker was thought
    dead): its late pieces are dropped, never joined to attempt 1's; attempt 1's first piece
    starts the answer over even before its ``stream_restarted``."""
    view = AnswerView()
    view.apply(_entry("token", "old "))
    view.apply(_entry("token", "new ", attempt=1))
    assert (view.text, view.restarts) == ("new ", 1)
    view.apply(_entry("token", "stale", attempt=0))
    view.apply(_entry("stream_restarted", attempt=0))
    view.apply(_entry("token", "answer", attempt=1))
    view.apply(_entry("stream_done", attempt=0))
    assert (view.text, view.done) == ("new answer", False)
    view.apply(_entry("stream_done", attempt=1))
    assert (view.text, view.done, view.attempt) == ("new answer", True, 1)
