"""A task that is not UTF-8 is refused naming the byte, never read with U+FFFD in its place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from coordinator.client import task_text
from shared.agent_profile import AgentProfileError, load_agent_file
from shared.task_spec import TaskSpecError, as_task_text, decode_task_text, load_task_file

INVALID = b'goal: "fix it"\nsteps: [{id: s, instruction: "caf\xe9 au lait"}]\n'
"""Latin-1 text: its byte 0xe9, on line 2, is not UTF-8."""
OFFSET = INVALID.index(b"\xe9")


def _says_where(message: str, source: str) -> None:
    assert message.startswith(f"{source}: not valid UTF-8 at byte offset {OFFSET} (line 2, ")
    assert "0xe9" in message
    assert "save it as UTF-8" in message


def test_a_task_file_that_is_not_utf8_is_refused_naming_the_byte(tmp_path: Path) -> None:
    """`orga run` / `orga submit` read the file: the first invalid byte's offset and the fix."""
    file = tmp_path / "task.yaml"
    file.write_bytes(INVALID)
    with pytest.raises(TaskSpecError) as caught:
        load_task_file(file)
    _says_where(str(caught.value), str(file))


def test_an_agent_file_that_is_not_utf8_is_refused_naming_the_byte(tmp_path: Path) -> None:
    """A profile file is read the same way."""
    file = tmp_path / "agent.yaml"
    file.write_bytes(b"name: a\nsystem_prompt: caf\xe9\n")
    with pytest.raises(
        AgentProfileError,
        match=r"not valid UTF-8 at byte offset 26 \(line 2, byte 19 of the line: 0xe9",
    ):
        load_agent_file(file)


def test_task_bytes_are_decoded_strictly() -> None:
    """Bytes from a stream are refused at the first invalid byte, and valid UTF-8 passes."""
    with pytest.raises(TaskSpecError) as caught:
        decode_task_text(INVALID, "intake entry 1-0")
    _says_where(str(caught.value), "intake entry 1-0")
    data = decode_task_text(INVALID.replace(b"\xe9", "é".encode()), "intake entry 1-0")
    assert data["steps"][0]["instruction"] == "café au lait"


def test_text_carrying_undecodable_bytes_is_refused() -> None:
    """A str holding the escapes of undecodable bytes (surrogateescape, as sys.argv or a file
    name carries them) is refused naming the byte it stands for; a lone surrogate too."""
    escaped = os.fsdecode(INVALID)
    with pytest.raises(TaskSpecError) as caught:
        decode_task_text(escaped, "task")
    _says_where(str(caught.value), "task")
    with pytest.raises(TaskSpecError, match=r"byte offset 7 \(line 1, byte 8 of the line: 0xed"):
        as_task_text('goal: "\ud800"')


def test_the_client_refuses_text_that_is_not_utf8() -> None:
    """The client refuses before anything reaches the intake stream."""
    for task in (INVALID, os.fsdecode(INVALID)):
        with pytest.raises(TaskSpecError) as caught:
            task_text(task)
        _says_where(str(caught.value), "submitted task")
    assert task_text("goal: café".encode()) == "goal: café"


def test_a_replacement_character_written_on_purpose_is_kept() -> None:
    """U+FFFD written as valid UTF-8 is a character like any other."""
    assert decode_task_text("goal: \ufffd".encode())["goal"] == "\ufffd"
