"""The model's side of a turn: what it said it would do, and whether it said it is stuck.

A :class:`ModelTurn` is one assistant message: its text (reasoning, plan, an instruction to
another agent, a reply to the user) and the calls it proposes. The output side cannot see a
stall that lives in the model's own messages (an orchestrator re-issuing near-identical
instructions while every page it gets back differs by OCR noise; an agent asking the user again
for what it already asked): :class:`PlanMemory` remembers the last few plans, normalised, and
says when a new one is a near-identical re-issue of one of them (rapidfuzz's normalised Indel
similarity on the masked text, as the output side masks outputs). :func:`self_report` reads an
explicit self-assessment where a model emits one: a progress ledger (Magentic-One's
``is_in_loop`` / ``is_progress_being_made``) or a plain statement that it is stuck.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Iterable, Sequence
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field
from rapidfuzz.distance import Indel

from shared.conversation import ConversationMessage, MessageRole
from shared.stagnation.fingerprint import canonical_json, digest, mask
from shared.stagnation.novelty import WordNovelty
from shared.stagnation.paraphrase import content_words, paraphrase_similarity
from shared.stagnation.targets import quoted_targets

__all__ = [
    "MAX_PLAN_CHARS",
    "ModelTurn",
    "Plan",
    "PlanMemory",
    "Reissue",
    "plan_of",
    "self_report",
]

MAX_PLAN_CHARS = 600
"""A plan is compared on its first 600 masked characters: enough to tell two instructions or
two replies apart, cheap to compare (rapidfuzz, O(n·m / 64)) and to persist."""

_LEDGER_LOOP = re.compile(r'"is_in_loop"\s*:\s*\{[^{}]*?"answer"\s*:\s*(true|false)', re.S)
_LEDGER_PROGRESS = re.compile(
    r'"is_progress_being_made"\s*:\s*\{[^{}]*?"answer"\s*:\s*(true|false)', re.S
)
# A plain first-person statement of being stuck, ending its clause: "So, I am stuck.", "we are
# going round in circles". What a model says about the code ("the test is stuck"), a topic
# ("I am stuck on why it passed before", "stuck with this API") or a condition ("if I cannot
# change the test, I am stuck") is not a self-report.
_STUCK = re.compile(
    r"\b(?:i am|i'm|we are|we're|i seem to be|we seem to be)\s+(?:still\s+|clearly\s+)?"
    r"(?:stuck|going (?:a)?round in circles|in a loop|looping)(?=\s*(?:[.!;:,)]|$))",
    re.IGNORECASE | re.MULTILINE,
)
_CLAUSE_START = re.compile(r"[.!?\n][^.!?\n]*\Z")
_CONDITIONAL = re.compile(r"\b(?:if|unless|otherwise|would|then|when)\b", re.IGNORECASE)


def _says_stuck(text: str) -> bool:
    for match in _STUCK.finditer(text):
        before = text[: match.start()]
        clause = _CLAUSE_START.search(before)
        sentence = before[clause.start() + 1 :] if clause else before
        if not _CONDITIONAL.search(sentence):
            return True
    return False


class ModelTurn(BaseModel):
    """One assistant message as the detector sees it: the text and the proposed calls.

    ``stuck`` is the model's own assessment when the host has it in structured form (a
    progress ledger's answers): True when it says it is looping or not progressing, False when
    it says it progresses, None when it says nothing. :meth:`from_message` reads it from the
    text.
    """

    model_config = ConfigDict(frozen=True)

    text: str = ""
    calls: tuple[str, ...] = Field(default=())
    stuck: bool | None = None

    @classmethod
    def from_message(cls, text: str, calls: Iterable[tuple[str, str]] = ()) -> ModelTurn:
        """A turn from an assistant message's text and its ``(tool name, arguments JSON)``
        calls; the self-assessment is read from the text (:func:`self_report`)."""
        signatures = tuple(_call_signature(name, arguments) for name, arguments in calls)
        return cls(text=text, calls=signatures, stuck=self_report(text))

    @classmethod
    def from_conversation(cls, messages: Iterable[ConversationMessage]) -> ModelTurn | None:
        """The turn of the first assistant message among ``messages`` (what one model response
        appended to the conversation), or None when there is none."""
        for message in messages:
            if message.role is MessageRole.ASSISTANT:
                calls = [(call.name, call.arguments) for call in message.tool_calls]
                return cls.from_message(message.content, calls)
        return None


def _call_signature(name: str, arguments: str) -> str:
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return f"{name}({arguments})"
    return f"{name}({canonical_json(parsed)})"


def self_report(text: str) -> bool | None:
    """True when the text says the model is stuck, False when a ledger says it progresses.

    A progress ledger answers both questions: looping (``is_in_loop``) or not progressing
    (``is_progress_being_made`` false) is stuck. Otherwise a first-person "I am stuck", "we
    are going round in circles", "I'm in a loop" is, unless it is a condition ("if I cannot
    change the test, I am stuck"); anything else says nothing (None).
    """
    loop = _LEDGER_LOOP.search(text)
    progress = _LEDGER_PROGRESS.search(text)
    if loop is not None or progress is not None:
        looping = loop is not None and loop.group(1) == "true"
        stalled = progress is not None and progress.group(1) == "false"
        return looping or stalled
    return True if _says_stuck(text) else None


Plan = tuple[str, str]
"""A turn as compared: its text (masked, lower-cased, whitespace collapsed, cut to
:data:`MAX_PLAN_CHARS`) and a digest of its calls (masked, in order)."""


def plan_of(turn: ModelTurn, min_chars: int = 0) -> Plan | None:
    """The turn's :data:`Plan`: near-identical texts proposing the same calls are one plan;
    the same words proposing other calls (a batch of lookups) are not.

    None when the plan's text is shorter than ``min_chars``: too short to be compared as a plan
    (its calls are then not digested: most turns of calls alone have no text at all).
    """
    # masked from a prefix: a long message costs what its first lines cost (no text: nothing)
    head = turn.text[: MAX_PLAN_CHARS * 4]
    text = " ".join(mask(head).lower().split())[:MAX_PLAN_CHARS] if head else ""
    if len(text) < min_chars:
        return None
    return text, digest("calls", *(mask(call) for call in turn.calls))


class Reissue(Enum):
    """What a plan is to the remembered ones (:meth:`PlanMemory.reissue`)."""

    NEW = "new"
    """Not a re-issue: a plan of its own, or one made again after news that could explain it."""
    ECHO = "echo"
    """The same request, word for word or in the same content words, made again after news:
    what came back did not change what is asked. Neither stale nor fresh."""
    STALE = "stale"
    """A re-issue of a plan made with nothing new come back since."""


class PlanMemory:
    """The last ``capacity`` plans and results, and a mark that moves with new information.

    The mark moves when a result comes back that shows enough content words no earlier result
    showed (:class:`~shared.stagnation.novelty.WordNovelty`; a result no longer than the
    compared beginning also when it is not a near-duplicate of one of the last ``capacity``
    results: the same page re-rendered with OCR noise is no information), and when a write
    changes something. :meth:`reissue` answers whether a plan is
    a near-identical re-issue (similarity at least ``threshold``) of a remembered plan issued
    at the current mark: nothing has come back since that could explain asking again.
    """

    def __init__(
        self,
        capacity: int,
        plans: Sequence[tuple[str, str, int]] = (),
        gists: Sequence[str] = (),
        mark: int = 0,
        words: Sequence[str] = (),
    ) -> None:
        self._plans: deque[tuple[str, str, int]] = deque(plans, maxlen=capacity)
        # the content words and quoted targets of each remembered plan, computed once (not
        # persisted: both are read again from the plans' texts on a restore)
        self._words: deque[frozenset[str]] = deque(
            (content_words(text) for text, _, _ in plans), maxlen=capacity
        )
        self._targets: deque[frozenset[str]] = deque(
            (quoted_targets(text) for text, _, _ in plans), maxlen=capacity
        )
        self._gists: deque[str] = deque(gists, maxlen=capacity)
        self._novelty = WordNovelty(words)
        self.mark = mark

    def reissue(
        self,
        plan: Plan,
        threshold: float,
        paraphrase: float = 1.0,
        echo: float = 0.0,
        target: float = 1.0,
    ) -> Reissue:
        """Whether ``plan`` re-issues a remembered plan with the same calls, the text
        near-identical (Indel similarity at least ``threshold``) or the same request in other
        words (content words at least ``paraphrase`` alike, Jaccard; 1.0: the same words only;
        at least ``target`` alike when both name the same quoted target,
        :func:`~shared.stagnation.targets.quoted_targets`; 1.0: no lower bar for them):
        :attr:`Reissue.STALE` when that plan was made at the current mark (nothing has come back
        since); else :attr:`Reissue.ECHO` when a plan made before the mark was near-identical
        or had content words at least ``echo`` alike (0: never an echo): the news since did
        not change what is asked; else :attr:`Reissue.NEW`. The plan is remembered either way.
        """
        text, calls = plan
        words = content_words(text)
        targets = quoted_targets(text)
        found = Reissue.NEW
        for (earlier, earlier_calls, since), earlier_words, earlier_targets in zip(
            self._plans, self._words, self._targets, strict=True
        ):
            at_mark = since == self.mark
            if calls != earlier_calls or not (at_mark or (echo and found is Reissue.NEW)):
                continue  # an echo needs one earlier plan: the rest are compared for staleness
            # the content words first (a set intersection), the characters only when they fail
            bar = paraphrase if at_mark else echo
            if at_mark and targets & earlier_targets:
                bar = min(bar, target)  # the same object asked for: fewer words need agree
            if paraphrase_similarity(words, earlier_words) >= bar or (
                Indel.normalized_similarity(text, earlier, score_cutoff=threshold) >= threshold
            ):
                if at_mark:
                    found = Reissue.STALE
                    break
                found = Reissue.ECHO
        self._plans.append((text, calls, self.mark))
        self._words.append(words)
        self._targets.append(targets)
        return found

    def result(self, gist: str, threshold: float, text: str = "", novelty: int = 0) -> None:
        """A new result came back. The mark moves when its ``text`` (masked) shows new content
        words (:meth:`WordNovelty.is_news` with ``novelty``), or, for a text no longer than
        :data:`MAX_PLAN_CHARS`, when its ``gist`` is not a near-duplicate of a recent one (at
        least ``threshold`` alike). ``novelty`` 0: the near-duplicate rule for every result."""
        fresh = self._novelty.is_news(text, novelty) if novelty else False
        if fresh or (
            (not novelty or len(text) <= MAX_PLAN_CHARS)
            and not any(Indel.normalized_similarity(gist, s) >= threshold for s in self._gists)
        ):
            self.mark += 1
        self._gists.append(gist)

    def changed(self) -> None:
        """A write changed something: what comes back next may differ, so asking again is fair."""
        self.mark += 1

    def clear(self) -> None:
        """Forget every plan and result (a milestone, a genuine user message)."""
        self._plans.clear()
        self._words.clear()
        self._targets.clear()
        self._gists.clear()
        self._novelty.clear()

    def dump(self) -> tuple[list[tuple[str, str, int]], list[str], int]:
        """Plans and results oldest first, and the mark, for the persisted state."""
        return list(self._plans), list(self._gists), self.mark

    def dump_words(self) -> list[str]:
        """The content words the results showed, least recently shown first."""
        return self._novelty.dump()
