"""How `orga run` prints streamed answers: a header per answer, the pieces as they come, a
restart said and the answer started over (to a pipe, piece by piece)."""

from __future__ import annotations

import io

from rich.console import Console

from orga.cli_tokens import TokenPrinter
from shared.tokens import TokenEntry


def _e(n: int, kind: str, text: str = "", iteration: int = 1, attempt: int = 0) -> TokenEntry:
    return TokenEntry(f"{n}-0", kind, "main", iteration, attempt, "act", text)  # type: ignore[arg-type]


def test_pieces_restarts_and_new_answers_to_a_pipe() -> None:
    """Written as they come; `[answer restarted: attempt 1]` before the second attempt."""
    raw = io.StringIO()
    printer = TokenPrinter(Console(file=io.StringIO()), raw)
    printer.show([_e(1, "token", "The te"), _e(2, "token", "sts")])
    assert raw.getvalue() == "main · iteration 1\nThe tests"
    printer.show([_e(3, "stream_restarted", attempt=1), _e(4, "token", "All good.", attempt=1)])
    printer.show([_e(5, "stream_done", attempt=1), _e(6, "token", "Next", iteration=2)])
    assert raw.getvalue() == (
        "main · iteration 1\nThe tests\n[answer restarted: attempt 1]\nAll good.\n"
        "main · iteration 2\nNext"
    )
    assert printer.after == "6-0"


def test_on_a_terminal_whole_lines_go_through_the_console() -> None:
    """Through the live display, text goes out a line at a time; the rest at the end."""
    shown = io.StringIO()
    printer = TokenPrinter(Console(file=shown, width=80), None)
    printer.show([_e(1, "token", "line one\nline t"), _e(2, "token", "wo")])
    assert shown.getvalue() == "main · iteration 1\nline one\n"
    printer.show([_e(3, "stream_done")])
    assert shown.getvalue() == "main · iteration 1\nline one\nline two\n"
