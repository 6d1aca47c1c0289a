"""A critic's spec in a task, its prompt, and the validation of its verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.agent_profile import parse_agent, resolve_agent
from shared.critic import CriticPayload, CriticReplyError, critic_conversation, parse_verdict
from shared.task_spec import CriticSpec, TaskSpecError, load_task_file, parse_task


def _step(critic: dict[str, object]) -> dict[str, object]:
    return {"goal": "g", "steps": [{"id": "s", "instruction": "x", "critic": critic}]}


@pytest.mark.parametrize(
    ("critic", "message"),
    [
        ({"rubric": "r"}, "a critic names its reviewer: `agent: NAME`"),
        ({"agent": "a", "human": True, "rubric": "r"}, "a critic is an agent or a human"),
        ({"agent": "a"}, "steps.0.critic.rubric: Field required"),
        ({"agent": "a", "rubric": "r", "max_rounds": -1}, "max_rounds: Input should be greater"),
        ({"human": True, "rubric": "r", "system_prompt": "x"}, "a human critic has no"),
        ({"agent": "a", "rubric": "r", "rounds": 2}, "steps.0.critic.rounds: Extra inputs"),
        ({"agent": "has space", "rubric": "r"}, "steps.0.critic.agent: String should match"),
    ],
)
def test_a_critic_spec_is_validated_strictly(critic: dict[str, object], message: str) -> None:
    """Each mistake in a critic is refused with a message naming it."""
    with pytest.raises(TaskSpecError, match=message.replace("(", r"\(").replace("`", "`")):
        parse_task(_step(critic))


def test_resolving_without_the_agent_names_the_known_ones() -> None:
    """The in-process intake refuses an unknown critic agent as the service does."""
    known = {"fixer": parse_agent({"name": "fixer"})}
    with pytest.raises(
        TaskSpecError, match=r"steps.0.critic: agent: 'nope' .* known agents: 'fixer'"
    ):
        resolve_agent(_step({"agent": "nope", "rubric": "r"}), known, "task")


def test_a_task_file_s_critic_script_is_taken_from_the_file_s_folder(tmp_path: Path) -> None:
    """A critic's provider script override is a path relative to the task file, like the
    task's own script."""
    (tmp_path / "critic.yaml").write_text("replies: ['{}']\n")
    critic = {"agent": "a", "rubric": "r", "provider": {"script": "critic.yaml"}}
    (tmp_path / "task.json").write_text(json.dumps(_step(critic)))
    spec = load_task_file(tmp_path / "task.json")
    resolved = spec.steps[0].critic
    assert resolved is not None and resolved.provider is not None
    assert resolved.provider.script == str(tmp_path / "critic.yaml")


def test_the_critic_s_question_holds_rubric_instruction_result_and_check() -> None:
    """The prompt shows the rubric, the instruction, the result, the check's output and the
    earlier verdicts, and says how to answer."""
    critic = CriticSpec(agent="rev", rubric="names the file", system_prompt="be strict")
    payload = CriticPayload(
        critic=critic.reviewer, rubric=critic.rubric, step_id="s", instruction="write notes",
        result="wrote notes.txt", done_when="test -f notes.txt", done_when_output="exit code: 0",
        round=2, max_rounds=2, verdicts=[{"verdict": "revise", "reason": "which file?"}],
    )  # fmt: skip
    system, question = critic_conversation(critic, payload).messages
    assert system.content == "be strict"
    parts = ["names the file", "write notes", "wrote notes.txt", "`test -f notes.txt`"]
    parts += ["exit code: 0", "- revise: which file?", "round 2", '"verdict": "approve"']
    for part in parts:
        assert part in question.content, part


@pytest.mark.parametrize(
    "text",
    [
        '{"verdict": "approve", "reason": "fine"}',
        'Here is my verdict: {"verdict": "approve", "reason": "fine"} -- thanks',
    ],
)
def test_a_verdict_is_read_alone_or_inside_text(text: str) -> None:
    """The JSON object is found in the answer."""
    reply = parse_verdict(text)
    assert (reply.verdict, reply.reason) == ("approve", "fine")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "the critic gave no answer text"),
        ("   ", "the critic gave no answer text"),
        ("looks fine", "is not a JSON object: 'looks fine'"),
        ("[1, 2]", "is not a JSON object"),
        ('{"verdict": "ok", "reason": "x"}', "verdict: Input should be 'approve' or 'revise'"),
        ('{"verdict": "revise", "reason": ""}', "reason: String should have at least 1"),
        ('{"verdict": "revise"}', "reason: Field required"),
        ('{"verdict": "approve", "reason": "x", "score": 3}', "score: Extra inputs"),
    ],
)
def test_a_malformed_verdict_says_what_is_wrong(text: str | None, message: str) -> None:
    """Every malformed reply is refused with what is wrong and the expected format."""
    with pytest.raises(CriticReplyError) as caught:
        parse_verdict(text)
    assert message in str(caught.value)
    assert '{"verdict": "approve"' in str(caught.value)
