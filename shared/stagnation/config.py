"""Thresholds of the stagnation detector, as data that a task can override.

Each signal has a :class:`Ladder`: the counts at which it reaches NUDGE, REPLAN, ASK_HUMAN and
ABORT. The defaults were chosen on the hand-labelled stuck and progressing runs scored in
``bench/stagnation_eval.py``, checked against the resolved Gemini-3-Pro SWE-bench runs (see
``docs/stagnation.md``): no labelled progressing run reaches REPLAN, under 2% of the resolved
Gemini runs reach ASK_HUMAN, and most labelled stalls reach REPLAN within 8 steps of their onset.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_serializer, model_validator

from shared.stagnation.verdict import StagnationLevel

__all__ = ["Ladder", "StagnationConfig"]


class Ladder(BaseModel):
    """Counts at which a signal reaches each level; each rung at least the one below it."""

    model_config = ConfigDict(frozen=True)

    nudge: int = Field(ge=1)
    replan: int = Field(ge=1)
    ask_human: int = Field(ge=1)
    abort: int = Field(ge=1)

    @model_validator(mode="after")
    def _ascending(self) -> Ladder:
        rungs = [self.nudge, self.replan, self.ask_human, self.abort]
        if rungs != sorted(rungs):
            raise ValueError(
                f"ladder rungs must not decrease (nudge <= replan <= ask_human <= abort), "
                f"got {rungs}; reorder them"
            )
        return self

    def rung(self, count: int) -> StagnationLevel:
        """The highest level whose threshold ``count`` reaches (NONE below ``nudge``)."""
        if count >= self.abort:
            return StagnationLevel.ABORT
        if count >= self.ask_human:
            return StagnationLevel.ASK_HUMAN
        if count >= self.replan:
            return StagnationLevel.REPLAN
        if count >= self.nudge:
            return StagnationLevel.NUDGE
        return StagnationLevel.NONE


def _stale_default() -> Ladder:
    return Ladder(nudge=4, replan=7, ask_human=12, abort=20)


def _repeat_default() -> Ladder:
    return Ladder(nudge=3, replan=4, ask_human=7, abort=10)


def _cycle_default() -> Ladder:
    return Ladder(nudge=3, replan=4, ask_human=6, abort=8)


def _error_default() -> Ladder:
    return Ladder(nudge=3, replan=4, ask_human=7, abort=10)


def _plan_default() -> Ladder:
    return Ladder(nudge=2, replan=3, ask_human=5, abort=8)


def _refusal_default() -> Ladder:
    return Ladder(nudge=2, replan=3, ask_human=5, abort=8)


class StagnationConfig(BaseModel):
    """Every threshold of the detector; the defaults are the production values.

    Nothing is ever flagged while ``steps_since_milestone <= min_steps`` (the step gate of the
    composite trigger). Above it, the level climbs, one rung per iteration, to the highest
    rung reached by any signal:

    - ``stale``: the stale run, a leaky count: each stale event adds one, each new result takes
      ``recovery`` steps or ``recovery_share`` of the run off, whichever is more (``recovery=0``:
      a new result ends the run at once); the episode ends when the run is empty;
    - ``repeat``: occurrences of the same (call, result) pair in the stale run, and of the same
      call answering or failing the same way in the last ``history`` events, whatever came
      between (an answer going round a cycle is the cycle's);
    - ``cycle``: full repetitions of a cycle of 2..``max_period`` (call, result) pairs;
    - ``error``: occurrences of the same error text from the same tool, whatever the arguments,
      in the stale run, and, for a read, a command or a write (the world's errors, not an
      *other* tool's), in the last ``history`` events whatever came between;
    - ``plan``: the model's stale turns (:meth:`StagnationDetector.observe_turn`), a leaky
      count: a turn that re-issues one of the last ``plan_memory`` plans (similarity at least
      ``plan_similarity`` on the masked text, or content words at least ``plan_paraphrase``
      alike: the same request in other words, or at least ``plan_target`` alike when both name
      the same quoted target (:mod:`shared.stagnation.targets`; ``plan_target`` at or above
      ``plan_paraphrase``: no lower bar); plans of ``plan_min_chars`` or more) with nothing
      new since, or that says the model is stuck, adds one; any other turn of at least
      ``plan_min_chars`` takes one off. New tool results do not drain it (they are the output
      side's); a milestone resets it. "Nothing new since" means no result that told the model
      something: a result longer than 600 masked characters must show at least
      ``plan_novelty`` content words no earlier result showed, or have a quarter of its own
      content words new; a shorter one must show such words or not be a near-duplicate
      (``plan_similarity``) of a recent one (``plan_novelty=0``: the near-duplicate rule for
      every result, the first release's). A turn that asks again what a plan made before the
      last news asked (near-identical, or content words at least ``plan_echo`` alike: an
      *echo*) neither adds nor takes off: the news did not change the request
      (``plan_echo=0``: no echo, such a turn takes one off, as before). A self-report adds one
      more when the first result after it tells the model nothing new, or, with
      ``plan_unanswered``, when the model speaks again before any result came back, with no
      call, without saying it progresses (a turn with calls leaves the report to their first
      result; ``plan_unanswered=False``: the first case only, as before);
    - ``refusal``: refusals of the same write on the same target (tool and path) since its last
      success, in the last ``history`` events, whatever the arguments; above NUDGE only when the
      refused call was re-sent unchanged after the same refusal
      (:mod:`shared.stagnation.signals.refusal`).

    ``history`` bounds the window in which repeats, cycles and errors are counted;
    ``max_seen_hashes`` and ``max_paths`` bound the memory of seen content (least recently seen
    is forgotten first). ``acknowledgements`` are outputs (stripped, lower-cased) of *other*
    tools (neither reads nor commands nor writes) that count neither as progress nor as a
    repeat: an empty read or search is information-free (stale), a command's silent success is
    judged as a result, a write by its after-state. A tool in ``patient_tools`` is waiting when
    its result does not change (polling a job): that is neutral too. ``enabled=False`` keeps
    counting but always answers NONE.
    """

    model_config = ConfigDict(frozen=True)

    enabled: bool = True
    min_steps: int = Field(default=4, ge=0)
    recovery: int = Field(default=1, ge=0)
    recovery_share: float = Field(default=1 / 3, ge=0.0, le=1.0)
    stale: Ladder = Field(default_factory=_stale_default)
    repeat: Ladder = Field(default_factory=_repeat_default)
    cycle: Ladder = Field(default_factory=_cycle_default)
    error: Ladder = Field(default_factory=_error_default)
    plan: Ladder = Field(default_factory=_plan_default)
    refusal: Ladder = Field(default_factory=_refusal_default)
    plan_similarity: float = Field(default=0.9, gt=0.0, le=1.0)
    plan_paraphrase: float = Field(default=0.6, gt=0.0, le=1.0)
    plan_novelty: int = Field(default=20, ge=0, le=1000)
    plan_echo: float = Field(default=0.9, ge=0.0, le=1.0)
    plan_target: float = Field(default=0.4, ge=0.0, le=1.0)
    plan_unanswered: bool = True
    plan_memory: int = Field(default=16, ge=1, le=256)
    plan_min_chars: int = Field(default=40, ge=1)
    max_period: int = Field(default=5, ge=2, le=10)
    history: int = Field(default=30, ge=4, le=1000)
    max_seen_hashes: int = Field(default=2048, ge=16, le=1_000_000)
    max_paths: int = Field(default=256, ge=1, le=100_000)
    acknowledgements: frozenset[str] = frozenset({"", "ok", "done"})
    patient_tools: frozenset[str] = frozenset()

    @field_serializer("acknowledgements", "patient_tools")
    def _sorted(self, value: frozenset[str]) -> list[str]:
        return sorted(value)

    @model_validator(mode="after")
    def _reachable(self) -> StagnationConfig:
        if self.history < self.max_period:
            raise ValueError(
                f"history={self.history} is shorter than max_period={self.max_period}; "
                f"raise history to at least {self.max_period}"
            )
        for name, top in (
            ("repeat", self.repeat.abort),
            ("error", self.error.abort),
            ("refusal", self.refusal.abort),
        ):
            if top > self.history:
                raise ValueError(
                    f"{name}.abort is {top} but counts are kept over history={self.history} "
                    f"events, so it could never be reached; raise history to at least {top}"
                )
        if self.cycle.abort * 2 > self.history:
            raise ValueError(
                f"cycle.abort is {self.cycle.abort} repetitions but history={self.history} holds "
                f"only {self.history // 2} repetitions of a 2-cycle; raise history to at least "
                f"{self.cycle.abort * 2}"
            )
        return self
