"""Entries of a task's tokens stream (``shared.keys.tokens_stream``), as watchers read them.

Reasoning workers write them (:mod:`workers.token_stream`, which documents the fields);
``orga run``, ``orga journal --follow``, the inbox and the API read them with
:func:`token_entry`. A watcher shows the ``token`` texts of one answer in order, starts that
answer over on ``stream_restarted`` or a newer attempt (never joining two answers), drops the
entries of an attempt older than one it saw of the same answer (an old attempt still
streaming), and knows it whole at ``stream_done``; :class:`AnswerView` does exactly that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["TOKEN_KINDS", "AnswerView", "TokenEntry", "token_entry"]

TOKEN_KINDS = ("token", "stream_restarted", "stream_done")


@dataclass(frozen=True, slots=True)
class TokenEntry:
    """One entry: its stream id, its kind, which answer it is of, and its text."""

    id: str
    kind: Literal["token", "stream_restarted", "stream_done"]
    step: str
    iteration: int
    attempt: int
    purpose: str
    text: str = ""

    def as_json(self) -> dict[str, str | int]:
        """The entry as one JSON object (``orga journal --follow``, the inbox, the API)."""
        return {
            "id": self.id,
            "kind": self.kind,
            "step": self.step,
            "iteration": self.iteration,
            "attempt": self.attempt,
            "purpose": self.purpose,
            "text": self.text,
        }


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def token_entry(entry_id: bytes | str, fields: Mapping[Any, Any]) -> TokenEntry | None:
    """The entry a stream message holds (bytes or decoded), or None for one that is not a
    token entry."""
    values = {_text(k): _text(v) for k, v in fields.items()}
    kind = values.get("kind")
    if kind not in TOKEN_KINDS:
        return None
    try:
        iteration, attempt = int(values.get("iteration", "")), int(values.get("attempt", ""))
    except ValueError:
        return None
    return TokenEntry(
        id=_text(entry_id),
        kind=kind,  # type: ignore[arg-type]  # checked against TOKEN_KINDS above
        step=values.get("step", ""),
        iteration=iteration,
        attempt=attempt,
        purpose=values.get("purpose", "act"),
        text=values.get("text", ""),
    )


@dataclass(slots=True)
class AnswerView:
    """The text of the answer being streamed, as a watcher shows it."""

    text: str = ""
    done: bool = False
    restarts: int = 0
    answer: tuple[str, int, str] | None = field(default=None)
    """(step, iteration, purpose) of the answer shown."""
    attempt: int = 0
    """The attempt of the answer shown."""
    highest: dict[tuple[str, int, str], int] = field(default_factory=dict)
    """The highest attempt seen of each answer: an older attempt that keeps streaming (its
    worker was thought dead, the call sent again) is dropped, never joined to the newer one."""

    def apply(self, entry: TokenEntry) -> None:
        """Take one entry: a piece appends, a restart or a new answer starts over; an entry of
        an attempt older than one seen of the same answer is dropped."""
        answer = (entry.step, entry.iteration, entry.purpose)
        if entry.attempt < self.highest.get(answer, entry.attempt):
            return
        self.highest[answer] = entry.attempt
        newer = answer == self.answer and entry.attempt > self.attempt
        if answer != self.answer or entry.kind == "stream_restarted" or newer:
            if answer == self.answer:
                self.restarts += 1
            self.answer, self.text, self.done = answer, "", False
            self.attempt = entry.attempt
        if entry.kind == "token":
            self.text += entry.text
        elif entry.kind == "stream_done":
            self.done = True
