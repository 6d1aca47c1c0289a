"""The texts a verdict carries: to the model for NUDGE and REPLAN, to the operator above."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shared.stagnation.verdict import ReasonCode, StagnationKind, StagnationLevel

__all__ = ["MessageContext", "render_message"]


@dataclass(frozen=True, slots=True)
class MessageContext:
    """What the texts quote: the level, kind, counters, detail line and milestones."""

    level: StagnationLevel
    kind: StagnationKind | None
    steps_since_milestone: int
    new_state_changes: int
    stale_steps: int
    detail: str
    reasons: Sequence[ReasonCode]
    milestones: Sequence[str]


def _counters(ctx: MessageContext) -> str:
    # a stall on the model's side alone has no stale tool steps to quote
    recent = f", none in the last {ctx.stale_steps} steps" if ctx.stale_steps else ""
    return (
        f"{ctx.steps_since_milestone} steps since the last milestone, "
        f"{ctx.new_state_changes} new state changes since then{recent}"
    )


def _nudge(ctx: MessageContext) -> str:
    return (
        f"[progress check] {_counters(ctx)}: {ctx.detail}. Before your next call, state which "
        "result you expect that you have not already seen; if you cannot, change approach."
    )


def _replan(ctx: MessageContext) -> str:
    amnesia = (
        " You are re-reading and re-running what you already saw: write down the facts you "
        "need from it once, then stop re-reading."
        if ctx.kind is StagnationKind.AMNESIA
        else ""
    )
    return (
        f"[replan required] {ctx.detail}. {_counters(ctx)}. Admit this path is dead: say in "
        "one line what you tried and why it did not work, then write a new plan that takes a "
        "different approach before you call any tool. Do not repeat a call whose result you "
        f"already have.{amnesia}"
    )


def _operator_summary(ctx: MessageContext) -> str:
    kind = ctx.kind.value if ctx.kind is not None else "unknown"
    reasons = ", ".join(r.value for r in ctx.reasons) or "none"
    return f"stagnation ({kind}): {_counters(ctx)}; {ctx.detail}; signals: {reasons}"


def _ask_human(ctx: MessageContext) -> str:
    last = ctx.milestones[-1] if ctx.milestones else "none reached"
    return (
        f"Agent needs review, {_operator_summary(ctx)}; last milestone: {last}. Redirect it, "
        "give it the missing fact, or stop it."
    )


def _abort(ctx: MessageContext) -> str:
    reached = ", ".join(ctx.milestones) if ctx.milestones else "none"
    return f"Run stopped, {_operator_summary(ctx)}. Milestones kept: {reached}."


def render_message(ctx: MessageContext) -> str:
    """The text for this level; empty for NONE."""
    if ctx.level is StagnationLevel.NONE:
        return ""
    renderers = {
        StagnationLevel.NUDGE: _nudge,
        StagnationLevel.REPLAN: _replan,
        StagnationLevel.ASK_HUMAN: _ask_human,
        StagnationLevel.ABORT: _abort,
    }
    return renderers[ctx.level](ctx)
