"""The stagnation detector on the distributed runtime: Redis, Celery worker processes, the
coordinator, scripted models that loop the ways the labelled stuck runs do."""

from __future__ import annotations

from typing import Any

import pytest

from shared.events import JournalEntry, StagnationDetected
from shared.stagnation import ReasonCode, StagnationLevel
from tests.integration.harness import REPO, Cluster, assert_journal_is_clean, status_of, wait_until

pytestmark = pytest.mark.integration

WANDERER = REPO / "examples" / "wanderer" / "task.yaml"

# A failing test run whose output changes every run: a timestamp, a process id, the line of
# the failing assertion and the duration. Only masked do two runs look alike.
FLAKY_FAILURE = """\
import time
n = time.time_ns() // 1000 % 100000
print(f"[2026-12-01 10:{n % 60:02d}:{n % 60:02d}] collecting tests (pid {n % 977})")
print(f"tests/test_config.py:{10 + n % 40}: in test_load")
print("E   KeyError: 'settings.DATABASE'")
print(f"1 failed in {n % 97 / 10:.2f}s")
raise SystemExit(1)
"""

RUN_IT = {"name": "run_command", "arguments": {"command": "python3 check.py"}}


def _task(replies: list[Any]) -> dict[str, Any]:
    return {
        "goal": "make the configuration load",
        "provider": {"kind": "scripted", "replies": replies},
        "steps": [{"id": "fix", "instruction": "Make check.py pass."}],
        "limits": {"max_iterations": 40},
    }


def _write_script() -> dict[str, Any]:
    call = {"name": "file_write", "arguments": {"path": "check.py", "content": FLAKY_FAILURE}}
    return {"tool_calls": [call]}


def _stagnation_levels(entries: list[JournalEntry]) -> list[StagnationLevel]:
    return [e.event.level for e in entries if isinstance(e.event, StagnationDetected)]


def _escalated_to_review(cluster: Cluster, task_id: str) -> list[JournalEntry]:
    client = cluster.client()
    wait_until(lambda: status_of(client, task_id) == "awaiting_review", 90, "escalation")
    review = cluster.orga("review", "show", client.status(task_id)["review_id"])
    assert '"source": "detector"' in review.stdout, review.stdout
    return client.journal(task_id)


def test_a_retried_failure_with_changing_output_is_escalated(cluster: Cluster) -> None:
    """run_command's raw output hash changes every run; the detector, comparing what the model
    sees masked, nudges, asks for a re-plan, then hands the task to a human."""
    replies = [_write_script(), *({"tool_calls": [RUN_IT]} for _ in range(30)), "done"]
    task_id = cluster.client().submit(_task(replies))
    entries = _escalated_to_review(cluster, task_id)
    levels = _stagnation_levels(entries)
    assert levels == [StagnationLevel.NUDGE, StagnationLevel.REPLAN, StagnationLevel.ASK_HUMAN]
    calls = [e for e in entries if e.event.type == "ToolsDispatched"]
    assert len(calls) <= 10, f"escalated only after {len(calls)} iterations"
    assert_journal_is_clean(entries)


def test_parallel_identical_calls_climb_one_rung_per_iteration(cluster: Cluster) -> None:
    """Three copies of the failing call in every response: no rung is skipped."""
    replies = [_write_script(), *({"tool_calls": [RUN_IT] * 3} for _ in range(30)), "done"]
    task_id = cluster.client().submit(_task(replies))
    entries = _escalated_to_review(cluster, task_id)
    levels = _stagnation_levels(entries)
    assert levels == [StagnationLevel.NUDGE, StagnationLevel.REPLAN, StagnationLevel.ASK_HUMAN]
    iterations = [e.iteration for e in entries if isinstance(e.event, StagnationDetected)]
    assert len(set(iterations)) == 3, f"two rungs in one iteration: {iterations}"


def test_the_wanderer_is_escalated_rung_by_rung(cluster: Cluster) -> None:
    """The example's wandering model (other reads and greps, nothing new): nudged, asked to
    re-plan, then escalated to a human."""
    task_id = cluster.client().submit(WANDERER)
    entries = _escalated_to_review(cluster, task_id)
    levels = _stagnation_levels(entries)
    assert levels == [StagnationLevel.NUDGE, StagnationLevel.REPLAN, StagnationLevel.ASK_HUMAN]


# A web form that comes back with a different word of OCR noise every time: new text to an
# output-side comparison, no news to the model (Who&When's FedEx form, clicked three times).
NOISY_FORM = """\
import random
import string
print("Calculate Shipping Rates | FedEx Brazil")
print("From: Rio de Janeiro, Brazil    To: New York, NY, USA")
print("Package: envelope    Service: International Economy (about one week)")
print("Please review the shipment details, then press CONTINUE to see the rates.")
print("OCR:", "".join(random.choices(string.ascii_lowercase, k=8)))
print("[ CONTINUE ]")
"""

OPEN_FORM = {"name": "run_command", "arguments": {"command": "python3 form.py"}}
# The orchestrator's instruction, re-issued near word for word every time.
INSTRUCTIONS = (
    "Please press CONTINUE on the FedEx rate form to get the price of the envelope to New York.",
    "Please press CONTINUE on the FedEx rate form to get the price for the envelope to New York.",
    "Please press CONTINUE on the FedEx rate form and get the price of the envelope to New York.",
)


def test_reissued_plans_with_no_news_climb_the_ladder(cluster: Cluster) -> None:
    """A model re-issuing a near-identical plan while the page it gets back differs only by
    noise is nudged, asked to re-plan, then handed to a human, from its own messages: every
    result is new text, so no output-side signal fires."""
    write = {"name": "file_write", "arguments": {"path": "form.py", "content": NOISY_FORM}}
    replies: list[Any] = [{"text": "I will write the form page.", "tool_calls": [write]}]
    replies += [
        {"text": INSTRUCTIONS[i % len(INSTRUCTIONS)], "tool_calls": [OPEN_FORM]} for i in range(20)
    ]
    task_id = cluster.client().submit(_task([*replies, "done"]))
    entries = _escalated_to_review(cluster, task_id)
    detected = [e for e in entries if isinstance(e.event, StagnationDetected)]
    assert [e.event.level for e in detected] == [
        StagnationLevel.NUDGE,
        StagnationLevel.REPLAN,
        StagnationLevel.ASK_HUMAN,
    ]
    assert [e.event.reason_codes for e in detected] == [[ReasonCode.REISSUED_PLAN]] * 3
    assert len({e.iteration for e in detected}) == 3, "two rungs in one iteration"
    calls = [e for e in entries if e.event.type == "ToolsDispatched"]
    assert len(calls) <= 10, f"escalated only after {len(calls)} iterations"
    assert_journal_is_clean(entries)
