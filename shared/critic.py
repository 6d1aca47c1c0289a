"""A critic's question and its answer: the prompt a critic model gets, and its verdict validated.

A step with ``critic: {agent: NAME, rubric, max_rounds}`` is reviewed before it completes: the
coordinator sends the critic agent's model the rubric, the step's instruction, the worker's
result and the ``done_when`` output (:func:`critic_conversation`), and the model answers with
JSON only: ``{"verdict": "approve" | "revise", "reason": "..."}``. :func:`parse_verdict` turns
that answer into a :class:`CriticReply`, or raises :class:`CriticReplyError` saying what is
wrong with it (the coordinator journals it, asks the critic once more, then escalates). This
module is pure: no Redis, no model call.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.conversation import Conversation, ConversationMessage
from shared.errors import OrgaError
from shared.task_spec import CriticSpec

__all__ = [
    "CRITIC_ANSWER_FORMAT",
    "DEFAULT_CRITIC_PROMPT",
    "CriticPayload",
    "CriticReply",
    "CriticReplyError",
    "critic_conversation",
    "parse_verdict",
]

DEFAULT_CRITIC_PROMPT = (
    "You are a critic. You review the result of one step of another agent's work against a "
    "rubric, and either approve it or ask for a revision, saying precisely what to change."
)

CRITIC_ANSWER_FORMAT = (
    "Answer with JSON only, no other text: "
    '{"verdict": "approve", "reason": "why it meets the rubric"} or '
    '{"verdict": "revise", "reason": "what to change, precisely"}.'
)

MAX_REASON_CHARS = 4_000
"""A verdict's reason longer than this is refused (it goes into the worker's conversation)."""

_SHOWN_CHARS = 8_000
"""How much of the result and of the ``done_when`` output the critic is shown."""


class CriticReplyError(OrgaError, ValueError):
    """A critic's reply is not a valid verdict; the message names what is wrong."""


class CriticReply(BaseModel):
    """A critic's verdict on a step's result."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    verdict: Literal["approve", "revise"]
    reason: str = Field(min_length=1, max_length=MAX_REASON_CHARS)


class CriticPayload(BaseModel):
    """What a critic reviews (a model's prompt, a human's review context): the rubric, the step,
    the worker's result, the ``done_when`` check's output, and the verdicts so far."""

    model_config = ConfigDict(frozen=True)

    critic: str
    rubric: str
    step_id: str
    instruction: str
    result: str
    done_when: str | None = None
    done_when_output: str | None = None
    round: int = Field(ge=1)
    max_rounds: int = Field(ge=0)
    verdicts: list[dict[str, str]] = Field(default_factory=list)
    """Earlier verdicts of this step: ``{"verdict", "reason", "decided_by"}``, oldest first."""

    def prompt(self) -> str:
        """The user message a critic model gets."""
        parts = [
            f"Rubric:\n{self.rubric}",
            f"Step {self.step_id!r}, the instruction the worker had:\n{self.instruction}",
            f"The worker's result:\n{self.result[-_SHOWN_CHARS:]}",
        ]
        if self.done_when is not None:
            output = (self.done_when_output or "")[-_SHOWN_CHARS:]
            parts.append(f"The step's check `{self.done_when}` passed; its output:\n{output}")
        if self.verdicts:
            earlier = "\n".join(f"- {v['verdict']}: {v['reason']}" for v in self.verdicts)
            parts.append(f"Your earlier verdicts on this step:\n{earlier}")
        parts.append(f"This is review round {self.round}. {CRITIC_ANSWER_FORMAT}")
        return "\n\n".join(parts)


def critic_conversation(critic: CriticSpec, payload: CriticPayload) -> Conversation:
    """The critic call's own conversation: the agent's system prompt, then the question."""
    system = critic.system_prompt or DEFAULT_CRITIC_PROMPT
    conversation = Conversation.with_system(system)
    conversation.push(ConversationMessage.user(payload.prompt()))
    return conversation


def parse_verdict(text: str | None) -> CriticReply:
    """The verdict in a critic model's answer (the JSON object, alone or inside other text);
    CriticReplyError naming what is wrong otherwise."""
    if text is None or not text.strip():
        raise CriticReplyError(
            "the critic gave no answer text (an empty reply, or tool calls instead of an "
            f"answer); {CRITIC_ANSWER_FORMAT}"
        )
    data = _json_object(text)
    if not isinstance(data, dict):
        raise CriticReplyError(
            f"the critic's reply is not a JSON object: {_short(text)}; {CRITIC_ANSWER_FORMAT}"
        )
    try:
        return CriticReply.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}"
            for e in exc.errors()[:4]
        )
        raise CriticReplyError(
            f"the critic's reply {_short(text)} is not a valid verdict ({problems}); "
            f"{CRITIC_ANSWER_FORMAT}"
        ) from exc


def _json_object(text: str) -> Any:
    start, end = text.find("{"), text.rfind("}")
    candidates = [text]
    if start != -1 and end > start:
        candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except (ValueError, RecursionError):
            continue
    return None


def _short(text: str) -> str:
    shown = repr(text.strip())
    return shown if len(shown) <= 120 else shown[:117] + "..."
