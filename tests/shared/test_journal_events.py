"""The journal events that explain a run: tool results capped and redacted, a gate's change
before and after, and entries written before these fields still read."""

from __future__ import annotations

import json

from shared.actions import GateModification, Observation, ToolCallAction
from shared.events import (
    JOURNAL_TEXT_CHARS,
    GateModified,
    JournalEntry,
    ObservationsCollected,
    ToolResultRecord,
)
from shared.redaction import REDACTED, Redactor

SECRET = "sk-live-0123456789abcdefXYZ"


def test_a_tool_result_is_redacted_and_capped() -> None:
    """A long result is cut to JOURNAL_TEXT_CHARS after redaction; its length is kept."""
    content = f"token={SECRET} " + "y" * 5000
    observation = Observation.tool_error("run_command", content).with_call_id("c1")
    record = ToolResultRecord.of(
        observation.with_metadata(error_type="timeout"), Redactor([SECRET])
    )
    assert SECRET not in record.content and record.content.startswith(f"token={REDACTED}")
    assert len(record.content) == JOURNAL_TEXT_CHARS
    assert record.full_chars == len(content)
    assert (record.call_id, record.tool, record.is_error, record.error_type) == (
        "c1",
        "run_command",
        True,
        "timeout",
    )
    short = ToolResultRecord.of(Observation.tool_result("file_read", "hello"))
    assert (short.content, short.full_chars) == ("hello", None)


def test_a_gate_change_keeps_before_and_after_redacted() -> None:
    """GateModified carries the proposed and the modified call, secrets redacted."""
    before = ToolCallAction(
        call_id="c1", name="web_fetch", arguments=json.dumps({"url": f"https://x/?k={SECRET}"})
    )
    after = before.model_copy(update={"arguments": json.dumps({"url": "https://x/"})})
    change = GateModification(before=before, after=after, reason="strip the key")
    event = GateModified.of(3, change, Redactor([SECRET]))
    assert event.iteration == 3 and event.call_id == "c1" and event.reason == "strip the key"
    assert isinstance(event.before, ToolCallAction) and SECRET not in event.before.arguments
    assert REDACTED in event.before.arguments
    assert event.after == after


def test_entries_written_before_the_new_fields_still_read() -> None:
    """An ObservationsCollected of an older journal (a count only) parses, with no results."""
    old = {
        "sequence": 4,
        "timestamp": "2026-11-30T01:54:25.966568Z",
        "agent_id": "agent",
        "iteration": 1,
        "event": {"type": "ObservationsCollected", "iteration": 1, "observation_count": 1},
    }
    entry = JournalEntry.model_validate_json(json.dumps(old))
    assert isinstance(entry.event, ObservationsCollected) and entry.event.results == []
    again = JournalEntry.model_validate_json(entry.model_dump_json())
    assert again == entry
