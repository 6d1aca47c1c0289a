"""Critics on both drivers: a step's result approved, revised then approved, revised past
``max_rounds`` (escalated with both sides' words), a malformed critic reply retried once then
escalated, and a human critic on the review queue; each run equals the in-process run of the
same task (:func:`tests.parity.drivers.comparable`)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from shared.agent_profile import AgentProfile
from shared.events import CriticReplyRejected, CriticRequested, CriticVerdict, JournalEntry
from tests.parity.drivers import Decision, LoopDriver, Outcome, comparable

RUBRIC = "The answer names the file it wrote and says why the step is done."
APPROVE = json.dumps({"verdict": "approve", "reason": "names a.txt and why it is done"})
REVISE = json.dumps({"verdict": "revise", "reason": "say which file you wrote"})
REVISE_AGAIN = json.dumps({"verdict": "revise", "reason": "still no file name"})
WRITE = {"tool_calls": [{"name": "file_write", "arguments": {"path": "a.txt", "content": "x"}}]}


@dataclass(frozen=True)
class CriticScenario:
    """A task with a critic step, its critic agent's replies, the reviewer's decisions, and
    what the run must show."""

    id: str
    worker: list[Any]
    critic: list[Any] | None
    check: Callable[[Outcome], None]
    max_rounds: int = 2
    decisions: tuple[Decision, ...] = field(default=())
    done_when: str | None = None

    def agent(self, name: str) -> AgentProfile:
        """The critic agent: a scripted model with its own replies and system prompt."""
        return AgentProfile(
            name=name,
            provider={"kind": "scripted", "replies": self.critic},  # type: ignore[arg-type]
            system_prompt="You are a strict reviewer of file work.",
        )

    def task(self, name: str) -> dict[str, Any]:
        """One step with its critic (this scenario's agent, or a human)."""
        reviewer: dict[str, Any] = {"human": True} if self.critic is None else {"agent": name}
        step: dict[str, Any] = {
            "id": "write",
            "instruction": "write a.txt and say so",
            "critic": {**reviewer, "rubric": RUBRIC, "max_rounds": self.max_rounds},
        }
        if self.done_when is not None:
            step["done_when"] = self.done_when
        return {
            "goal": "write a file a reviewer accepts",
            "provider": {"kind": "scripted", "replies": self.worker},
            "steps": [step],
        }


def _events(outcome: Outcome, kind: type[Any]) -> list[Any]:
    return [e.event for e in outcome.journal if isinstance(e.event, kind)]


def _approved_first_time(outcome: Outcome) -> None:
    assert outcome.status == "completed", outcome.result
    assert outcome.result["output"] == "I wrote a.txt; done"
    assert outcome.record.milestones == ["step:write"]  # verified by done_when, then approved
    (asked,) = _events(outcome, CriticRequested)
    assert asked.round == 1 and asked.critic.startswith("agent:critic-")
    (verdict,) = _events(outcome, CriticVerdict)
    assert verdict.verdict == "approve" and verdict.reason == "names a.txt and why it is done"
    critic_prompt = outcome.record.steps[0].critique
    assert critic_prompt is not None and critic_prompt.check_output is not None
    # The critic's tokens count against the task's budget.
    worker_tokens = sum(e.usage.total_tokens for e in outcome.events_of("ReasoningComplete"))
    assert verdict.usage.total_tokens > 0
    assert outcome.record.usage.total_tokens == worker_tokens + verdict.usage.total_tokens


def _revised_then_approved(outcome: Outcome) -> None:
    assert outcome.status == "completed", outcome.result
    assert outcome.result["output"] == "I wrote a.txt because the step asks for it"
    verdicts = [v.verdict for v in _events(outcome, CriticVerdict)]
    assert verdicts == ["revise", "approve"]
    assert [r.round for r in _events(outcome, CriticRequested)] == [1, 2]
    fed_back = [m for m in outcome.messages() if m.startswith("[Critic agent:critic-")]
    assert len(fed_back) == 1 and fed_back[0].endswith("say which file you wrote")


def _escalated_past_max_rounds(outcome: Outcome) -> None:
    assert outcome.status == "awaiting_review", outcome.result
    review = outcome.record.review
    assert review is not None and review.source == "critic_escalation"
    assert "beyond its max_rounds (1)" in review.reason
    payload = review.snapshot["critic"]
    assert payload["result"] == "second try"  # the worker's words
    assert [v["reason"] for v in payload["verdicts"]] == [
        "say which file you wrote",
        "still no file name",
    ]  # and the critic's
    assert payload["rubric"] == RUBRIC


def _malformed_retried(outcome: Outcome) -> None:
    assert outcome.status == "completed", outcome.result
    (rejected,) = _events(outcome, CriticReplyRejected)
    assert rejected.retried and "not a JSON object" in rejected.error
    (verdict,) = _events(outcome, CriticVerdict)
    assert verdict.verdict == "approve"


def _malformed_twice_escalated(outcome: Outcome) -> None:
    assert outcome.status == "awaiting_review", outcome.result
    rejected = _events(outcome, CriticReplyRejected)
    assert [r.retried for r in rejected] == [True, False]
    assert "verdict" in rejected[1].error  # {"verdict": "maybe"} names the field at fault
    review = outcome.record.review
    assert review is not None and review.source == "critic_escalation"
    assert "gave no valid verdict" in review.reason


def _human_revised_then_approved(outcome: Outcome) -> None:
    assert outcome.status == "completed", outcome.result
    assert outcome.result["output"] == "I wrote a.txt because the step asks for it"
    asked = _events(outcome, CriticRequested)
    assert [(a.critic, a.round) for a in asked] == [("human", 1), ("human", 2)]
    assert all(a.review_id for a in asked)
    verdicts = [(v.verdict, v.decided_by) for v in _events(outcome, CriticVerdict)]
    assert verdicts == [("revise", "human:parity"), ("approve", "human:parity")]
    assert "[Critic human:parity] Revise the result of step 'write'" in "\n".join(
        outcome.messages()
    )


def _human_critic_waits(outcome: Outcome) -> None:
    assert outcome.status == "awaiting_review", outcome.result
    review = outcome.record.review
    assert review is not None and review.source == "critic"
    assert review.snapshot["critic"]["result"] == "I wrote a.txt; done"
    assert review.snapshot["critic"]["critic"] == "human"


SCENARIOS = [
    CriticScenario(
        "approved-first-time",
        [WRITE, "I wrote a.txt; done"],
        [APPROVE],
        _approved_first_time,
        done_when="test -f a.txt",
    ),
    CriticScenario(
        "revised-then-approved",
        ["I am done", "I wrote a.txt because the step asks for it"],
        [REVISE, APPROVE],
        _revised_then_approved,
    ),
    CriticScenario(
        "revised-past-max-rounds",
        ["first try", "second try"],
        [REVISE, REVISE_AGAIN],
        _escalated_past_max_rounds,
        max_rounds=1,
    ),
    CriticScenario(
        "malformed-reply-retried", ["done"], ["looks fine to me", APPROVE], _malformed_retried
    ),
    CriticScenario(
        "malformed-reply-escalated",
        ["done"],
        ["looks fine to me", json.dumps({"verdict": "maybe", "reason": "hm"})],
        _malformed_twice_escalated,
    ),
    CriticScenario("human-critic-waits", ["I wrote a.txt; done"], None, _human_critic_waits),
    CriticScenario(
        "human-critic-revise-then-approve",
        ["I am done", "I wrote a.txt because the step asks for it"],
        None,
        _human_revised_then_approved,
        decisions=(Decision("revise", "say which file you wrote"), Decision("approve")),
    ),
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_critics_run_alike_on_both_drivers(
    driver: LoopDriver, reference: LoopDriver, scenario: CriticScenario
) -> None:
    """A critic scenario ends as it should, with the in-process run's journal and result."""
    name = f"critic-{uuid.uuid4().hex[:8]}"
    agents = [] if scenario.critic is None else [scenario.agent(name)]
    outcome = driver.run(scenario.task(name), scenario.decisions, agents)
    scenario.check(outcome)
    for entry in outcome.journal:
        assert JournalEntry.model_validate_json(entry.model_dump_json()) == entry
    expected = reference.run(scenario.task(name), scenario.decisions, agents)
    assert comparable(outcome) == comparable(expected)
