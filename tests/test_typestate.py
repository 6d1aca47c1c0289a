"""The ORGA phases are a typestate: invalid transitions are type errors under mypy strict."""

from __future__ import annotations

import re
from pathlib import Path

from mypy import api

HERE = Path(__file__).parent
INVALID = HERE / "typing" / "invalid_transitions.py"


def _expected_error_lines() -> set[int]:
    lines = INVALID.read_text().splitlines()
    return {number for number, line in enumerate(lines, start=1) if "# E:" in line}


def test_mypy_rejects_every_invalid_transition() -> None:
    """Each line marked ``# E:`` is an attr-defined error, and nothing else is reported."""
    stdout, _stderr, status = api.run(
        ["--strict", "--no-incremental", "--show-error-codes", str(INVALID)]
    )
    reported = {
        int(match.group(1))
        for match in re.finditer(
            r"invalid_transitions\.py:(\d+): error: .*\[attr-defined\]", stdout
        )
    }
    assert status == 1, stdout
    assert reported == _expected_error_lines(), stdout
    assert "has no attribute" in stdout
