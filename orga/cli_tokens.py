"""How the CLI shows the model's answers as they stream (``orga run``).

Each answer starts on its own line under a dim header (``step main · iteration 2``); its
pieces are written as they come. A ``stream_restarted`` prints ``[answer restarted]`` and the
answer again from its start, never the rest of the first one (:mod:`shared.tokens`). On a
terminal, where the progress bar redraws below, text goes out a whole line at a time; to a
pipe or a file, piece by piece.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TextIO

from rich.console import Console
from rich.text import Text

from shared.tokens import AnswerView, TokenEntry

__all__ = ["TokenPrinter"]


class TokenPrinter:
    """Writes streamed answers to ``raw`` piece by piece, or, without it, a line at a time to
    ``console`` (through its live display)."""

    def __init__(self, console: Console, raw: TextIO | None) -> None:
        self._console = console
        self._raw = raw
        self._view = AnswerView()
        self._line = ""
        self.after = "0-0"
        """The id of the last entry shown: read the stream after it."""

    def show(self, entries: Iterable[TokenEntry]) -> None:
        """Print what ``entries`` add to the answers shown so far."""
        for entry in entries:
            self.after = entry.id
            answer, restarts = self._view.answer, self._view.restarts
            self._view.apply(entry)
            if self._view.answer != answer:
                self._end_line()
                label = f"{entry.step} · iteration {entry.iteration}"
                if entry.purpose != "act":
                    label += f" · {entry.purpose}"
                self._say(Text(label, style="dim"))
            elif self._view.restarts != restarts:
                self._end_line()
                self._say(Text(f"[answer restarted: attempt {entry.attempt}]", style="yellow"))
            if entry.kind == "token":
                self._write(entry.text)
            elif entry.kind == "stream_done":
                self._end_line()

    def _say(self, text: Text) -> None:
        if self._raw is not None:
            self._raw.write(text.plain + "\n")
            self._raw.flush()
        else:
            self._console.print(text)

    def _write(self, piece: str) -> None:
        if self._raw is not None:
            self._raw.write(piece)
            self._raw.flush()
            self._line = piece.rpartition("\n")[2] if "\n" in piece else self._line + piece
            return
        lines = (self._line + piece).split("\n")
        for line in lines[:-1]:
            self._console.print(line, markup=False, highlight=False)
        self._line = lines[-1]

    def _end_line(self) -> None:
        """Finish the current line, if one is open."""
        if not self._line:
            return
        if self._raw is not None:
            self._raw.write("\n")
            self._raw.flush()
        else:
            self._console.print(self._line, markup=False, highlight=False)
        self._line = ""
